"""gavel's pure core: messages, reasons, timing, the auction, the award rule and strategies.

Nothing here touches asyncio, NATS, git, processes or the clock; the shells pass ``now`` in.
"""

from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict
from gavel.shared.award import NodeBid, NodeDecline, order
from gavel.shared.health import Health, Liveness
from gavel.shared.reasons import Reason, summarize_declines
from gavel.shared.timing import Timing

__all__ = [
    "Auction",
    "Awarded",
    "Decision",
    "Health",
    "Liveness",
    "NodeBid",
    "NodeDecline",
    "Reason",
    "Timing",
    "Unschedulable",
    "Verdict",
    "order",
    "summarize_declines",
]
