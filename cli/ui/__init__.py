"""`gavel ui`: a read-only web dashboard of the cluster, live in the browser.

The page is HTML, CSS and JavaScript shipped in the package (`static/`), served by the
standard library on asyncio streams (`http`), kept live by server-sent events. Behind it the
dashboard is an operator client like the CLI (`feed`): the broker's API and its event
stream over NATS, so the broker speaks no HTTP. `access` says who may read it, `views` what
the page is sent, `logs` where an instance's lines come from, `app` the routes and the
command (`gavel.cli.ui.app.start` runs one in the caller's event loop, as `gavel up` does).
"""
