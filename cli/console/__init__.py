"""The web console (``graphrun serve``): a face over the same library calls as the CLI.

``app`` (the Starlette application), ``listing`` (runs and inbox queries),
``decide`` (statements and answers), ``accounts`` (accounts, passkeys, sessions,
tokens in the event database), ``passkeys`` (passkeys as OpenSSH keys), ``submit``
(runs started from the API), ``openapi``, and ``serve`` (the command).
"""
