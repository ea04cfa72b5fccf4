"""``python -m graphrun.cli``."""

from graphrun.cli import main

main()
