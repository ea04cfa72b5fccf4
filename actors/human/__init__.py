"""People: the terminal prompts, answer parsing and validation, the human actor."""
