"""graphrun.actors.providers."""
