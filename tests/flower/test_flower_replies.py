"""Replies from other machines are checked before they become client results."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import ArrayRecord  # noqa: E402
from tiny import TwoLayer  # noqa: E402

from fedbug.core.units import ParamSpace, find_units  # noqa: E402
from fedbug.engine.checks import check_update  # noqa: E402
from fedbug.engine.client import ClientResult  # noqa: E402
from fedbug.integrations.flower.messages import ReplyError, decode_reply, encode_reply  # noqa: E402


@pytest.fixture
def space():
    model = TwoLayer()
    return ParamSpace(model, find_units(model, torch.zeros(1, 2)))


def result(space, sent=(False, True)):
    delta = torch.arange(space.total, dtype=torch.float32) / 10
    return ClientResult(
        3,
        5,
        delta,
        list(sent),
        {},
        train_loss=0.5,
        uploaded=list(sent),
        extras={"c_delta": torch.ones(space.total)},
        info={"importance": [0.25, 0.5]},
        figures={"n_frozen": 1},
    )


def test_a_reply_round_trips_with_only_the_sent_units(space):
    res = result(space)
    content = encode_reply(res, space, [False, True])
    assert set(content.array_records["update"].keys()) == {"second.weight", "second.bias"}
    back = decode_reply(content, space, 3)
    first = space.unit_slices[0]
    assert torch.equal(back.delta[first], torch.zeros_like(back.delta[first]))
    second = space.unit_slices[1]
    assert torch.equal(back.delta[second], res.delta[second])
    assert back.num_samples == 5 and back.trained == [False, True]
    assert back.train_loss == 0.5 and back.figures == {"n_frozen": 1}
    assert back.info == {"importance": [0.25, 0.5]}
    assert back.extras.keys() == {"c_delta"}
    assert torch.equal(back.extras["c_delta"], torch.ones(space.total))  # the extras channel


def test_unknown_key_wrong_shape_and_wrong_client_are_refused(space):
    content = encode_reply(result(space), space, [False, True])
    extra = dict(content.array_records["update"].to_torch_state_dict())
    extra["first.weight"] = torch.zeros(2, 2)  # a unit the reply says it did not send
    content["update"] = ArrayRecord(extra)
    with pytest.raises(ReplyError, match="unexpected arrays"):
        decode_reply(content, space, 3)
    content = encode_reply(result(space), space, [False, True])
    bad = dict(content.array_records["update"].to_torch_state_dict())
    bad["second.weight"] = torch.zeros(3, 2)
    content["update"] = ArrayRecord(bad)
    with pytest.raises(ReplyError, match="shape"):
        decode_reply(content, space, 3)
    with pytest.raises(ReplyError, match="client"):
        decode_reply(encode_reply(result(space), space, [False, True]), space, 4)
    # a unit it says it uploaded without sending: the server would average in a zero
    with pytest.raises(ReplyError, match="uploaded flags differ"):
        decode_reply(encode_reply(result(space), space, [True, True]), space, 3)


def test_non_finite_values_pass_decoding_and_fail_the_update_check(space):
    res = result(space)
    res.delta[space.unit_slices[1].start] = float("nan")
    back = decode_reply(encode_reply(res, space, [False, True]), space, 3)
    assert check_update(back, space).startswith("non-finite")


def test_every_number_and_flag_of_a_result_travels(space):
    """Each scalar field of ClientResult (found from its type, not from the wire's list) comes
    back as it was sent: a field added to ClientResult cannot arrive as its default on Flower."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(ClientResult)
    res = result(space)
    sent_values = {}
    for i, f in enumerate(dataclasses.fields(ClientResult)):
        kind = hints[f.name]
        if f.name in ("client", "num_samples"):
            continue
        if kind in (bool, bool | None):
            sent_values[f.name] = True
        elif kind in (int, int | None):
            sent_values[f.name] = 1000 + i
        elif kind in (float, float | None):
            sent_values[f.name] = 0.25 + i
    assert {"steps", "flops", "bytes_up", "charged_time", "state_reset"} <= set(sent_values)
    res = dataclasses.replace(res, **sent_values)
    back = decode_reply(encode_reply(res, space, [False, True]), space, 3)
    assert {k: getattr(back, k) for k in sent_values} == sent_values
