"""Fault points the snapshot tests inject: a keeper client that runs a test's code before a publish."""


class BeforePublish:
    """A `KeeperClient` whose `publish` first calls `before(step)`: to hold, or fail, a write
    there (bytes copied, not yet published), as the launcher's `chaos.FaultPoints` do."""

    def __init__(self, client, before):
        self._client, self._before = client, before

    def publish(self, slot: int, token: int, *, step: int, **record):
        self._before(step)
        return self._client.publish(slot, token, step=step, **record)

    def __getattr__(self, name):
        return getattr(self._client, name)
