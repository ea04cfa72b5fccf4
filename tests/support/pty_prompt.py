"""Ask one question on the terminal and print the answer as JSON on stdout.

Usage::

    python pty_prompt.py choice QUESTION OPTION...
    python pty_prompt.py text QUESTION [DEFAULT]

Prints ``{"text": ..., "channel": ...}``. When the person aborts, prints the
error on stderr and exits with its exit code, as the CLI does.
"""

from __future__ import annotations

import json
import sys

from graphrun.actors.human.prompt import HumanInputAborted, ask_choice, ask_text


def main(argv: list[str]) -> int:
    mode, question, *rest = argv
    try:
        if mode == "choice":
            answer = ask_choice(question, rest)
        else:
            answer = ask_text(question, default=rest[0] if rest else None)
    except HumanInputAborted as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(json.dumps({"text": answer.text, "channel": answer.channel}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
