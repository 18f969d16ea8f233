"""Channels carry messages between a platform and the gateway. None of them imports the agent loop."""
