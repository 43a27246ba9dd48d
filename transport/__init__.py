"""NATS for every role: the wire (batched publishing, direct subscriptions, the subscription
barrier), the operator's API client, credentials and the nkey identities with their server
permissions, the event loop, and the nats-server wrapper.

Both the broker and the worker stand on this package; it imports only `gavel.shared`.
"""
