"""gavel.client: the typed Python client of a gavel cluster's API (NATS request/reply).

One method per verb of the `gavel` command, each taking and returning the structs of
`gavel.shared.api` (the NATS API's own: no second schema). `Client` is async; `SyncClient`
runs one in a thread of its own for code that is not. docs/api.md has examples.

    async with await Client.connect("nats://127.0.0.1:4222", creds="operator.nk") as c:
        reply = await c.submit(spec, key="build-1234")
        inst = await c.wait(reply.instance_id)
"""

from gavel.client.aio import Client, Ended, Retries
from gavel.client.jobwait import TimedOut
from gavel.client.runwait import Watch
from gavel.client.sync import SyncClient
from gavel.transport.client import (
    BrokerRefused,
    ClientError,
    NoAnswer,
    NoBroker,
    NoNats,
    NotAllowed,
)

__all__ = ["BrokerRefused", "Client", "ClientError", "Ended", "NoAnswer", "NoBroker",
           "NoNats", "NotAllowed", "Retries", "SyncClient", "TimedOut", "Watch"]
