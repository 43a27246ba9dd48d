"""`gavel api`: the cluster's API over HTTP, with its OpenAPI document.

An operator client of the NATS API like the dashboard (`gavel.client` on one connection),
served by the dashboard's small server on asyncio streams (`gavel.cli.ui.http`, with a
policy that takes bodies). `routes` maps each route to a verb and builds its request from
that verb's own struct, `openapi` makes the document from the same structs, `errors` gives a
refusal its status, `app` answers, streams and runs the command.
"""
