"""The gateway: makes a Caddy route to every healthy running replica of each spec that
declares routes, through Caddy's admin API, following every placement.

`Keeper` is the daemon's loop (an operator client of the broker's API); `caddyconfig` turns
the route table (`gavel.shared.routes`) into Caddy JSON and the admin requests that install
it; `Admin` speaks the admin API; `Caddy` runs the binary for `gavel up` and the tests.
"""

from gavel.gateway.admin import Admin, AdminError
from gavel.gateway.caddyconfig import Desired, Op, desired, plan
from gavel.gateway.caddyserver import Caddy
from gavel.gateway.keeper import Keeper

__all__ = ["Admin", "AdminError", "Caddy", "Desired", "Keeper", "Op", "desired", "plan"]
