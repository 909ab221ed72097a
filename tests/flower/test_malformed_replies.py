"""A malformed reply costs the server its client, never the round: each is one reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("flwr")

from flowergrid import _wire, task_identity  # noqa: E402
from flwr.app import ConfigRecord, Error, Message, RecordDict  # noqa: E402
from tiny import TwoLayer  # noqa: E402

from fedbug.core.protocol import ClientResult  # noqa: E402
from fedbug.core.units import ParamSpace, find_units  # noqa: E402
from fedbug.integrations.flower.executor import FlowerExecutor  # noqa: E402
from fedbug.integrations.flower.messages import ReplyError, decode_reply, encode_reply  # noqa: E402


# before: "x" was a ValueError and [3] a TypeError out of the round; "3" and 3.0 passed as 3
@pytest.mark.parametrize("sender", ["x", [3], None, "3", 3.0, True])
def test_a_reply_whose_client_is_not_an_int_is_refused(sender):
    model = TwoLayer()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    res = ClientResult(3, 5, torch.zeros(space.total), [True, True], {}, train_loss=0.5)
    content = encode_reply(res, space, [True, True])
    if sender is None:
        del content.config_records["result"]["client"]
    else:
        content.config_records["result"]["client"] = sender
    with pytest.raises(ReplyError, match="reply is for client"):
        decode_reply(content, space, 3)


def test_an_error_reply_without_a_reason_is_one_line():
    executor = FlowerExecutor(
        None, SimpleNamespace(cfg=SimpleNamespace(flower=None)), map_once=True
    )
    with task_identity():
        asked = RecordDict({"q": ConfigRecord({"a": 1})})
        sent = Message(asked, dst_node_id=5, message_type="train")
        # Flower reads an empty reason back as None: before, a TypeError out of the round
        reply = _wire(Message(Error(code=3, reason=""), reply_to=sent))
    assert reply.error.reason is None
    assert executor._read(reply, 3) == "error reply (code 3): no reason given"
