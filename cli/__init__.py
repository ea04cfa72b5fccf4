"""graphrun.cli."""
