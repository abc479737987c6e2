"""The nsqpy client: asyncio and blocking producers and consumers."""
