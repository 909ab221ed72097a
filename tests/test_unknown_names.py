"""An unknown name is one line in one style wherever it is looked up: a registry's miss reads as
the config's ("unknown KIND 'x' (did you mean 'y'?); known: ..."), and says how a name of the
user's own becomes known where a user registers that kind."""

from __future__ import annotations

import pytest

from fedbug.config import load_config
from fedbug.core.registry import Registry
from fedbug.errors import ConfigError
from fedbug.policies import POLICIES

HOW = "register it in a module and pass --import MODULE"


def test_a_registry_miss_reads_as_the_configs_message():
    things: Registry[int] = Registry("thing")
    things.register("beta")(2)
    things.register("alpha")(1)
    with pytest.raises(ConfigError) as exc:
        things.get("alpah")
    assert str(exc.value) == "unknown thing 'alpah' (did you mean 'alpha'?); known: alpha, beta"
    with pytest.raises(ConfigError) as exc:
        things.get("zzz")
    assert str(exc.value) == "unknown thing 'zzz'; known: alpha, beta"


def test_a_policy_registry_miss_says_how_to_make_ones_own_known():
    with pytest.raises(ConfigError) as exc:
        POLICIES.get("bottom_upp")
    msg = str(exc.value)
    assert msg.startswith("unknown freeze policy 'bottom_upp' (did you mean 'bottom_up'?); known: ")
    assert msg.endswith(f"; a policy of your own: {HOW}")


def test_an_unknown_method_names_an_algorithm_of_ones_own():
    """There is no method registry: a registered algorithm is what ``method:`` accepts."""
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["method=nosuch"])
    assert str(exc.value).endswith(f"; an algorithm of your own: {HOW}")
