"""The run loop: the pure decider, the driver, policies, reducers, answers, lifecycle."""
