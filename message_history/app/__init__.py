"""The application shell: the service, the command line and its commands.

Replay, dead letters, prune, forget, check, demo: everything here may import every layer below.
"""
