"""graphrun.actors."""
