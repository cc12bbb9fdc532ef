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

from collections.abc import Iterable
from typing import Any

from flwr.common.constant import SUPERLINK_NODE_ID


def answering_node(reply: Any, sent: Iterable[Any]) -> int:
    """The node ``reply`` answers for: its sender, or, for an error reply whose sender is the
    SuperLink, the destination of the message of ``sent`` it answers (its sender when it
    answers none of them). ``sent`` is read only for such an error reply."""
    sender = reply.metadata.src_node_id
    if sender == SUPERLINK_NODE_ID and reply.has_error():
        answered = reply.metadata.reply_to_message_id
        for message in sent:
            if answered and message.metadata.message_id == answered:
                return message.metadata.dst_node_id
    return sender
