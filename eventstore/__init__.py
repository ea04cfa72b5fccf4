"""graphrun.eventstore."""
