"""Which node a reply answers for.

A reply answers for its sender. The one exception is the error reply Flower's SuperLink
writes itself when a message's destination is gone (``NODE_UNAVAILABLE`` and the like): its
sender is the SuperLink (``SUPERLINK_NODE_ID``), and it answers for the destination of the
message it replies to. Any other sender that is not the node asked (a node outside the
round, or one answering another node's message) answers only for itself: the SuperLink
refuses such a reply, and a grid that does not must not let it speak for another node
(charge it an offence, or claim its identity).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.common.constant import SUPERLINK_NODE_ID


def answering_node(reply: Any, destination_of: Callable[[str], int | None]) -> int:
    """The node ``reply`` answers for (``destination_of``: message id -> the node it was sent
    to, ``None`` for a message not sent): its sender, or, for an error reply whose sender is
    the SuperLink, the destination of the message it answers (its sender when that message
    was not sent). ``destination_of`` is called only for such an error reply."""
    sender = reply.metadata.src_node_id
    if sender == SUPERLINK_NODE_ID and reply.has_error():
        node = destination_of(reply.metadata.reply_to_message_id)
        return sender if node is None else node
    return sender
