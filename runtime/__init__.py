"""graphrun.runtime."""
