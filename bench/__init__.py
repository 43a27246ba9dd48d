"""`gavel bench`: the broker against a real nats-server, a real git repo and N live agents,
with the machine's own ceilings measured in the same run."""

__all__: list[str] = []
