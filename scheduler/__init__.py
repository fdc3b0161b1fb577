"""The conductor's policy (pure: time is an argument) and the trace simulator.

Entry point for the conductor daemon: :class:`scheduler.conductor.Conductor`.
"""
