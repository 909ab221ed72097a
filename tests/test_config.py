"""Configs: defaults, algorithm blocks, override parsing, validation errors, hashing, resolve."""

from __future__ import annotations

import math
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError
from tiny import method_needs, registries_restored

from fedbug.algorithms import ALGORITHMS
from fedbug.algorithms.fedavg import FedAvg
from fedbug.config import (
    BaseConfig,
    Config,
    all_keys,
    config_hash,
    load_config,
    parse_override,
    parse_value,
    read_config_doc,
    resolve,
    set_dotted,
    validate,
)
from fedbug.errors import ConfigError, FedbugError
from fedbug.policies import POLICIES

# -- defaults --------------------------------------------------------------------------------


def test_defaults_match_the_fedbug_appendix():
    cfg = load_config(None)
    assert cfg.lr == 0.1
    assert cfg.weight_decay == 1e-3
    assert cfg.batch_size == 50
    assert cfg.fedprox.mu == 1e-4
    assert cfg.feddyn.alpha == 0.01
    assert cfg.feddecorr.beta == 0.01
    assert cfg.fedexp.epsilon(1) == 1e-3  # the paper's epsilon unless set
    assert cfg.fedexp.eps_decay == 1.0


def test_other_defaults_match_the_readme():
    cfg = load_config(None)
    expected = {
        "seed": 0,
        "dataset": "digits",
        "num_clients": 20,
        "partition": "dirichlet",
        "alpha": 0.3,
        "model": "digits_cnn",
        "rounds": 30,
        "local_epochs": 5,
        "local_steps": None,
        "optimizer": "sgd",
        "lr_decay": 1.0,
        "momentum": 0.0,
        "clip_grad_norm": None,
        "algorithm": "fedavg",
        "global_lr": 1.0,
        "policy": "none",
        "bottom_up.gu_ratio": 0.4,
        "fixed_top.fixed_units": 1,
        "participation": 0.1,
        "clients_per_round": None,
        "weighting": "samples",
        "eval_every": 1,
        "eval_batch_size": 100,
        "memory_format": "channels_last",
        "checkpoint_every": 10,
        "count_flops": True,
        "threads": None,
        "grid": None,
        "seeds": 1,
    }

    def value(key):
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        return node

    assert {k: value(k) for k in expected} == expected
    assert cfg.resolved_selection() == "bernoulli"


def test_every_algorithm_block_is_present_with_its_defaults():
    cfg = load_config(None)
    keys = set(all_keys())
    names = ALGORITHMS.names()
    assert {"fedavg", "fedprox", "feddyn", "fedexp", "feddecorr"} <= set(names)
    for name, cls in ALGORITHMS.items():
        if cls.params_cls is None:
            continue
        block = getattr(cfg, name)
        assert isinstance(block, cls.params_cls)
        assert block == cls.params_cls()
        for field in cls.params_cls.model_fields:
            assert f"{name}.{field}" in keys
    for name in ("fedprox", "feddyn", "fedexp", "feddecorr"):
        assert name in Config.model_fields


def test_every_algorithm_and_policy_name_validates():
    for name in ALGORITHMS.names():
        # an algorithm with no global model is evaluated per client (compat refuses global)
        own = {} if ALGORITHMS.get(name).has_global_model else {"evaluation": "personalized"}
        doc = {"algorithm": name, **own, **method_needs(name)}
        assert load_config(None, doc=doc).algorithm == name
    for name in POLICIES.names():
        assert load_config(None, doc={"policy": name, **method_needs(name)}).policy == name


# -- overrides -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", 1),
        ("-3", -3),
        ("0.5", 0.5),
        ("1.0e-3", 1e-3),
        ("true", True),
        ("false", False),
        ("null", None),
        ("~", None),
        ("abc", "abc"),
        ("'1'", "1"),
        ("", ""),
        ("  ", ""),
        ("[a, b]", ["a", "b"]),
        ("[conv1, [bn1, fc]]", ["conv1", ["bn1", "fc"]]),
        ("[]", []),
        ("{mu: 0.5}", {"mu": 0.5}),
        ("[unclosed", "[unclosed"),  # not YAML: kept as text, for validation to judge
        ("héllo ✓", "héllo ✓"),
    ],
)
def test_parse_value_reads_yaml(text, value):
    assert parse_value(text) == value


def test_parse_override_splits_at_first_equals_and_strips_key():
    assert parse_override(" lr =0.05") == ("lr", 0.05)
    assert parse_override("name=a=b") == ("name", "a=b")
    assert parse_override("fedprox.mu=1") == ("fedprox.mu", 1)
    for bad in ("lr", "=1", " =1", ""):
        with pytest.raises(ConfigError, match="key=value"):
            parse_override(bad)


def test_overrides_apply_typed_values():
    cfg = load_config(
        None,
        [
            "rounds=7",
            "lr=5e-2",  # PyYAML reads 5e-2 as a string; the float field still parses it
            "count_flops=false",
            "clip_grad_norm=10",
            "local_steps=null",
            "units=[hidden.0, [hidden.1, classifier]]",
            "algorithm=fedprox",
            "fedprox.mu=1e-3",
            "fedexp={variant: code, eps_decay: 0.996}",
            "grid={bottom_up.gu_ratio: [0, 0.5], fedexp.eps: [0.001]}",  # a cell's fedexp
        ],
    )
    assert cfg.rounds == 7 and isinstance(cfg.rounds, int)
    assert cfg.lr == 0.05
    assert cfg.count_flops is False
    assert cfg.clip_grad_norm == 10.0
    assert cfg.local_steps is None
    assert cfg.units == ["hidden.0", ["hidden.1", "classifier"]]
    assert cfg.fedprox.mu == 1e-3
    assert cfg.fedexp.variant == "code" and cfg.fedexp.eps_decay == 0.996
    assert cfg.fedexp.epsilon(1) == 1.0
    assert cfg.grid == {"bottom_up.gu_ratio": [0, 0.5], "fedexp.eps": [0.001]}


def test_later_overrides_win_and_dotted_keys_merge_into_blocks(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm: fedexp\nfedexp: {variant: code}\nlr: 0.2\n", encoding="utf-8")
    cfg = load_config(path, ["lr=0.3", "lr=0.4", "fedexp.eps=2"])
    assert cfg.lr == 0.4
    assert cfg.fedexp.variant == "code"  # kept from the file
    assert cfg.fedexp.eps == 2.0


def test_set_dotted():
    doc: dict = {"fedprox": {"mu": 1}, "lr": 0.1}
    set_dotted(doc, "fedprox.mu", 2)
    set_dotted(doc, "new.block.key", 3)
    assert doc == {"fedprox": {"mu": 2}, "lr": 0.1, "new": {"block": {"key": 3}}}
    with pytest.raises(ConfigError, match="not a block"):
        set_dotted(doc, "lr.x", 1)
    for bad in (".x", "x.", "a..b"):
        with pytest.raises(ConfigError, match="bad override key"):
            set_dotted(doc, bad, 1)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, meant",
    [
        ("rl", "lr"),
        ("roudns", "rounds"),
        ("bogus", None),
        ("foo", None),
        ("gu_ratio", "bottom_up.gu_ratio"),  # that name in a block before a likeness
        ("heterofl.rate", "heterofl.rates"),  # in a block, its own keys' likeness first
        ("cohort.memory", "cohort.memory_mb"),
        ("fedpart.unist_per_round", "fedpart.units_per_round"),  # one swap, not any anagram
    ],
)
def test_an_unknown_key_suggests_only_a_real_likeness(key, meant):
    with pytest.raises(ConfigError) as exc:
        load_config(None, doc={key: 1})
    hint = f"did you mean {meant!r}?" if meant else "did you mean"
    assert (hint in str(exc.value)) == (meant is not None), str(exc.value)


@pytest.mark.parametrize("doc", [[], ["lr", 0.1], "lr: 0.1", 3, None])
def test_validate_refuses_non_mappings(doc):
    with pytest.raises(ConfigError, match="mapping"):
        validate(doc)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["lrr=0.1"], ["unknown key 'lrr'", "did you mean 'lr'"]),
        (["fedprox.mux=1"], ["'fedprox.mux'", "'fedprox.mu'"]),
        (["bottom_up.gu_ratoi=0.5"], ["'bottom_up.gu_ratio'"]),
        (["zzzzzz=1"], ["unknown key 'zzzzzz'", "README"]),
        (["rounds=abc"], ["rounds", "'abc'"]),
        (["rounds=2.5"], ["rounds"]),
        (["bottom_up.gu_ratio=1.5"], ["gu_ratio"]),
        (["lr=-1"], ["lr"]),
        (["lr=0"], ["lr"]),
        (["lr=.nan"], ["lr"]),
        (["participation=0"], ["participation"]),
        (["participation=1.01"], ["participation"]),
        (["momentum=1"], ["momentum"]),
        (["seed=-1"], ["seed"]),
        (["name=a/b"], ["name"]),
        (["name="], ["name"]),
        (["algorithm=fedbugg"], ["'fedbugg'", "fedavg"]),
        (["policy=nope"], ["'nope'", "bottom_up", "top_down"]),
        (["num_clients=3", "clients_per_round=4"], ["clients_per_round=4", "num_clients=3"]),
        (["selection=uniform"], ["clients_per_round"]),
        (["grid={lr: 0.1}"], ["grid.lr"]),
        (["fedprox={mu: -1}"], ["fedprox.mu"]),
        (["fedexp.variant=both"], ["fedexp.variant"]),
        (["feddyn.alpha=0"], ["feddyn.alpha"]),
        (["units=3"], ["units"]),
        (["rounds=[1, 2]"], ["rounds"]),
        (["rounds={a: 1}"], ["rounds", "a mapping"]),
        (["data_dir=" + "x" * 300, "rounds=x" + "y" * 300], ["..."]),
    ],
)
def test_invalid_overrides_raise_one_line_config_error(overrides, words):
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("invalid config: ") or msg.startswith("unknown ")
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(exc.value, FedbugError) and exc.value.exit_code == 2


FEDPART_KEYS = "rounds_per_unit, warmup, full_between, cycles, order, units_per_round"


@pytest.mark.parametrize(
    "overrides, message",
    [
        # no key of the block is close: the block's own keys, not the block's name or a stranger
        (["method=fedpart", "fedpart.bogus=1"], f"'fedpart.bogus'; fedpart takes: {FEDPART_KEYS}"),
        (
            ["method=slt", "slt.bogus=1"],
            "'slt.bogus'; slt takes: constraint, configs, schedule, switch_rounds, eval",
        ),
        (
            ["policy=apf", "apf.bogus=1"],
            "'apf.bogus'; apf takes: ema_alpha, stable_threshold, tighten_at, random_freezing",
        ),
        # a typo of one of the block's keys: that key, alone
        (
            ["method=fedpart", "fedpart.rounds_per_units=2"],
            "'fedpart.rounds_per_units'; did you mean 'fedpart.rounds_per_unit'?",
        ),
        # a key of another block, or of the top level, put in this one: that key, and this
        # block's own
        (
            ["method=fedpart", "fedpart.mu=1"],
            f"'fedpart.mu'; did you mean 'fedprox.mu'? fedpart takes: {FEDPART_KEYS}",
        ),
        (
            ["method=fedpart", "fedpart.lr=0.1"],
            f"'fedpart.lr'; did you mean 'lr'? fedpart takes: {FEDPART_KEYS}",
        ),
    ],
)
def test_an_unknown_key_in_a_block_names_the_blocks_keys(overrides, message):
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides)
    assert str(exc.value) == f"invalid config: unknown key {message}"


class _ToyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float = 0.5
    beta_steps: int = 3


class _Toy(FedAvg):
    name = "toy_opts"
    params_cls = _ToyParams


@pytest.fixture
def toy_algorithm():
    with registries_restored(ALGORITHMS):
        ALGORITHMS.register(_Toy.name)(_Toy)
        yield


def test_a_users_algorithm_block_names_its_keys_too(toy_algorithm):
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["algorithm=toy_opts", "toy_opts.gamma=1"])
    assert (
        str(exc.value)
        == "invalid config: unknown key 'toy_opts.gamma'; toy_opts takes: alpha, beta_steps"
    )
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["algorithm=toy_opts", "toy_opts.beta_step=1"])
    assert str(exc.value).endswith("did you mean 'toy_opts.beta_steps'?")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["method=heterofl", "heterofl.rates=[1.5, 0.5]"],
            "heterofl.rates: every heterofl rate must be in (0, 1]; got [1.5]",
        ),
        (
            ["method=slt", "slt.configs=[[1.5, 0.1]]"],
            "slt.configs: a width s must be in (0, 1]; got [1.5, 0.1]",
        ),
        (
            ["method=slt", "slt.configs=[]"],
            "slt.configs needs at least one [s, f] pair, e.g. [[0.5, 0.1]] (got [])",
        ),
        (
            ["rounds=2.5"],
            "rounds: Input should be a valid integer, got a number with a fractional part "
            "(got 2.5)",
        ),
        (
            ["rounds=abc"],
            "rounds: Input should be a valid integer, unable to parse string as an "
            "integer (got 'abc')",
        ),
    ],
)
def test_a_refused_value_names_its_key_and_value_once(overrides, message):
    with pytest.raises(ConfigError) as exc:
        load_config(None, overrides)
    assert str(exc.value) == f"invalid config: {message}"


def test_an_unknown_method_lists_each_known_name_once():
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["method=nosuch"])
    msg = str(exc.value)
    assert msg.startswith("unknown method 'nosuch'; known: apf, cocofl, fedavg, ")
    known = msg.split("; known: ")[1].split("; ")[0].split(", ")  # then the --import hint
    assert known == sorted(set(known))
    # each a preset and an algorithm: once each
    assert {"fedrolex", "fjord", "heterofl", "local", "slt"} <= set(known)


def test_name_with_equals_is_refused():
    with pytest.raises(ConfigError, match="name"):
        load_config(None, ["name=x=y"])


def test_read_config_doc_names_the_run_after_the_file(tmp_path):
    path = tmp_path / "my exp (v2).yaml"
    path.write_text("lr: 0.2\n", encoding="utf-8")
    doc = read_config_doc(path)
    assert doc == {"lr": 0.2, "name": "my-exp--v2-"}
    assert load_config(path).name == "my-exp--v2-"
    (tmp_path / "named.yaml").write_text("name: given\n", encoding="utf-8")
    assert load_config(tmp_path / "named.yaml").name == "given"
    (tmp_path / "empty.yaml").write_text("", encoding="utf-8")
    assert load_config(tmp_path / "empty.yaml").name == "empty"


@pytest.mark.parametrize(
    "content, match",
    [
        ("- 1\n- 2\n", "mapping"),
        ("[unclosed\n", "not valid YAML"),
        ("a: b: c\n", "not valid YAML"),
    ],
)
def test_read_config_doc_errors(tmp_path, content, match):
    path = tmp_path / "bad.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as exc:
        read_config_doc(path)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="not found"):
        read_config_doc(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not found"):
        read_config_doc(tmp_path)  # a folder is not a config file


@pytest.mark.parametrize("text", ["lr=!!float abc", "rounds=!!int x", "seed=!!timestamp x"])
def test_bad_yaml_tag_in_override_is_config_error(text):
    with pytest.raises(ConfigError):
        load_config(None, [text])


def test_error_message_stays_one_line_with_newline_in_a_key():
    with pytest.raises(ConfigError) as exc:
        load_config(None, ['grid={"a\\nb": 1}'])
    assert "\n" not in str(exc.value)


# -- hashing and resolve ---------------------------------------------------------------------


def test_config_hash_ignores_bookkeeping_but_not_numbers():
    base = load_config(None)
    h = config_hash(base)
    assert len(h) == 10 and all(c in "0123456789abcdef" for c in h)
    assert config_hash(load_config(None)) == h
    same = [
        ["name=other"],
        ["seeds=5"],
        ["grid={bottom_up.gu_ratio: [0, 0.5]}"],
        ["name=x", "seeds=3", "grid={lr: [0.1]}"],
        ["count_flops=false"],
    ]
    for o in same:
        assert config_hash(load_config(None, o)) == h, o
    different = [
        ["lr=0.05"],
        ["seed=1"],
        ["algorithm=fedprox", "fedprox.mu=0.01"],
        ["policy=bottom_up"],
        ["policy=bottom_up", "bottom_up.gu_ratio=0.5"],
        ["algorithm=fedprox"],
        ["num_clients=10"],
    ]
    hashes = {config_hash(load_config(None, o)) for o in different}
    assert h not in hashes
    assert len(hashes) == len(different)


@pytest.mark.parametrize(
    ("overrides", "before"),
    [
        ([], "87aa743fed"),
        (["policy=bottom_up", "bottom_up.gu_ratio=0.5"], "9b68ddb944"),
        (["policy=fixed_top", "fixed_top.fixed_units=3"], "46c977afb6"),
        (["method=freezefl", "system={abilities: uniform}", "clients_per_round=5"], "0e1b898c4c"),
    ],
)
def test_config_hash_kept_when_policies_took_their_options_into_blocks(overrides, before):
    """Hashes written by fedbug before policy options moved into blocks (then top-level
    gu_ratio / fixed_units): their run folders still resume."""
    assert config_hash(load_config(None, overrides)) == before


@pytest.mark.parametrize(
    ("base", "before", "option", "other"),
    [
        (["algorithm=feddyn"], "1946592037", "feddyn.clip", "loss"),
        (
            ["policy=bottom_up", "bottom_up.gu_ratio=0.5"],
            "9b68ddb944",
            "bottom_up.gu_period",
            "floor",
        ),  # fmt: skip
        (["policy=top_down"], "90f553525a", "top_down.gu_period", "floor"),
    ],
)
def test_config_hash_kept_for_options_added_later(base, before, option, other):
    """Options added to a block after run folders existed (hashes written before them): at
    their default, given or not, the hash is the one from before; set otherwise, it moves."""
    default = {"feddyn.clip": "all"}.get(option, "exact")
    assert config_hash(load_config(None, base)) == before
    assert config_hash(load_config(None, [*base, f"{option}={default}"])) == before
    assert config_hash(load_config(None, [*base, f"{option}={other}"])) != before


def test_config_hash_same_for_equal_values_written_differently(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "lr: 0.05\nrounds: 3\nalgorithm: fedprox\nfedprox: {mu: 0.001}\n", encoding="utf-8"
    )
    from_file = load_config(path)
    overrides = ["lr=5e-2", "rounds=3.0", "algorithm=fedprox", "fedprox.mu=1.0e-3"]
    from_overrides = load_config(None, overrides)
    assert config_hash(from_file) == config_hash(from_overrides)


def test_resolve_fills_threads_and_keeps_given_ones():
    cfg = load_config(None)
    assert cfg.threads is None
    r = resolve(cfg)
    assert r.threads == (os.cpu_count() or 1)
    assert cfg.threads is None  # not mutated
    assert resolve(r) is r
    assert r.model_dump(exclude={"threads"}) == cfg.model_dump(exclude={"threads"})
    given = load_config(None, ["threads=3"])
    assert resolve(given).threads == 3


def test_resolved_config_round_trips_through_yaml():
    cfg = resolve(load_config(None, ["algorithm=fedexp", "units=[[a, b], c]", "lr=0.02"]))
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    again = validate(yaml.safe_load(text))
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)


def test_validate_assignment():
    cfg = load_config(None)
    with pytest.raises(ValidationError):
        cfg.lr = -1
    assert isinstance(cfg, BaseConfig)


# -- fuzzing: any override is a valid config or a ConfigError --------------------------------

KEYS = all_keys()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)


def _yaml_text(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6).strip()


# Raw text omits '!' so that YAML tags (tested on their own above) are not drawn.
raw_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="!"), max_size=20
)
value_texts = values.map(_yaml_text).map(lambda s: s.removesuffix("...").strip()) | raw_text
keys = (
    st.sampled_from(KEYS)
    | st.text(min_size=0, max_size=12)
    | st.lists(st.sampled_from(KEYS) | st.text(max_size=5), min_size=1, max_size=3).map(".".join)
)
# Well-typed values for known keys, so that a fair share of the drawn configs are valid.
WORDS = [*ALGORITHMS.names(), *POLICIES.names(), "iid", "dirichlet", "sgd", "adam", "uniform"]
WORDS += ["bernoulli", "samples", "paper", "code", "digits", "mlp"]
float_keys = st.sampled_from(
    ["lr", "bottom_up.gu_ratio", "participation", "momentum", "weight_decay", "alpha", "lr_decay"]
    + ["global_lr", "fedprox.mu", "feddyn.alpha", "feddecorr.beta", "fedexp.eps"]
)
int_keys = st.sampled_from(
    ["rounds", "num_clients", "clients_per_round", "seed", "local_steps", "batch_size"]
    + ["fixed_top.fixed_units", "seeds", "threads", "eval_every", "checkpoint_every"]
)
word_keys = st.sampled_from(
    ["algorithm", "policy", "name", "partition", "optimizer", "selection", "weighting"]
    + ["fedexp.variant", "dataset", "model"]
)
typed = (
    st.builds("{}={!r}".format, float_keys, st.floats(-0.5, 1.5))
    | st.builds("{}={}".format, int_keys, st.integers(-2, 40))
    | st.builds("{}={}".format, word_keys, st.sampled_from(WORDS) | st.text(max_size=6))
)
override = (
    typed | typed | st.builds(lambda k, v: f"{k}={v}", keys, value_texts) | st.text(max_size=20)
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override, max_size=4))
def test_any_overrides_give_a_valid_config_or_a_config_error(overrides):
    try:
        cfg = load_config(None, overrides)
    except ConfigError as e:
        assert str(e)
        return
    assert isinstance(cfg, BaseConfig)
    assert 0.0 <= cfg.bottom_up.gu_ratio <= 1.0
    assert cfg.lr > 0 and not math.isnan(cfg.lr)
    assert cfg.algorithm in ALGORITHMS and cfg.policy in POLICIES
    assert len(config_hash(cfg)) == 10
    # what is accepted also survives the trip through config.yaml
    dumped = yaml.safe_dump(resolve(cfg).model_dump(mode="json"), allow_unicode=True)
    validate(yaml.safe_load(dumped))


def test_a_grid_lets_its_base_hold_the_blocks_of_the_methods_it_names_only():
    from fedbug.config import grid_blocks

    assert grid_blocks({"algorithm": ["fedavg", "fedprox"]}) == {"fedprox"}
    assert grid_blocks({"fedprox.mu": [0.1, 1.0]}) == {"fedprox"}
    variant = [{"label": "FedBug", "policy": "bottom_up", "bottom_up.gu_ratio": 0.5}]
    assert grid_blocks({"variant": variant}) == {"bottom_up"}
    # a preset brings its methods' blocks: freezefl (policy and preset) and reputation
    assert grid_blocks({"method": ["fedavg", "freezefl"]}) == {"freezefl", "reputation"}
    base = {"algorithm": "fedavg", "fedprox": {"mu": 0.01}}
    load_config(None, doc={**base, "grid": {"algorithm": ["fedavg", "fedprox"]}})
    with pytest.raises(ConfigError, match="fedprox: has no effect under algorithm: fedavg"):
        load_config(None, doc={**base, "grid": {"policy": ["none", "bottom_up"]}})


def test_a_method_fills_what_the_config_leaves_and_refuses_a_disagreeing_method_key():
    cfg = load_config(None, ["method=heterofl", "weighting=samples"])
    assert (cfg.algorithm, cfg.weighting, cfg.clip_grad_norm) == ("heterofl", "samples", 1.0)
    with pytest.raises(ConfigError, match="method: heterofl sets algorithm: heterofl, but the "
                       "config sets algorithm: fedavg; remove one"):  # fmt: skip
        load_config(None, ["algorithm=fedavg", "method=heterofl"])
    with pytest.raises(ConfigError, match="method: fedpart sets policy: fedpart"):
        load_config(None, ["policy=bottom_up", "method=fedpart"])


def test_a_method_on_the_command_line_replaces_the_files_choice_of_method(tmp_path):
    """``-s method=X`` on a config that runs another method runs X as its preset says (any
    ``-s`` wins over the file); what the command line sets beside it composes with it."""
    path = tmp_path / "c.yaml"
    path.write_text("dataset: digits\nalgorithm: feddyn\npolicy: fixed_head\n"
                    "selection: uniform\nclients_per_round: 2\nlr: 0.05\n")  # fmt: skip
    cfg = load_config(path, ["method=fedpart"])
    assert (cfg.policy, cfg.algorithm, cfg.upload, cfg.lr) == ("fedpart", "fedavg", "partial", 0.05)
    cfg = load_config(path, ["method=slt"])
    assert (cfg.policy, cfg.algorithm, cfg.weighting) == ("none", "slt", "uniform")
    cfg = load_config(path, ["method=slt", "policy=bottom_up"])
    assert (cfg.policy, cfg.algorithm) == ("bottom_up", "slt")
    assert load_config(path).algorithm == "feddyn"  # no method given: the file as it is
    # the options blocks of what no longer runs go too; those the command line sets stay
    path.write_text("dataset: digits\npolicy: bottom_up\nbottom_up: {gu_ratio: 0.3}\n"
                    "method: freezefl\nreputation: {warm_restart: 2}\nsystem: {}\n")  # fmt: skip
    cfg = load_config(path, ["method=slt", "clients_per_round=2"])
    assert (cfg.policy, cfg.algorithm, cfg.resolved_selection()) == ("none", "slt", "uniform")
    assert cfg.system is not None  # not a method's block: kept
    cfg = load_config(path, ["method=slt", "policy=bottom_up", "clients_per_round=2"])
    assert cfg.options("bottom_up").gu_ratio == 0.3
    cfg = load_config(path, ["method=freezefl", "clients_per_round=2"])
    assert cfg.options("reputation").warm_restart == 2
    path.write_text("dataset: digits\nalgorithm: fedprox\nfedprox: {mu: 0.5}\n")
    assert load_config(path, ["method=null"]).options("fedprox").mu == 0.5  # not a name
    path.write_text("dataset: digits\nmethod: fedpart\npolicy: bottom_up\n")
    with pytest.raises(ConfigError, match="method: fedpart sets policy: fedpart"):
        load_config(path)  # the file disagreeing with itself


def test_a_null_override_gives_the_key_back_its_default():
    """``-s participation=null`` beside ``-s clients_per_round=4`` on a file that sets
    participation: the file's value is gone (the two would be refused together), and a block's
    key set to null takes its default."""
    from fedbug.config.loading import with_overrides

    doc = {"participation": 0.25, "algorithm": "fedprox", "fedprox": {"mu": 0.5}}
    out = with_overrides(doc, ["clients_per_round=4", "participation=null", "fedprox.mu=null"])
    assert out == {"clients_per_round": 4, "algorithm": "fedprox", "fedprox": {}}
    cfg = load_config(None, doc=out)
    assert cfg.participation == type(cfg).model_fields["participation"].default
    with pytest.raises(ConfigError, match=r"remove one of them \(-s participation=null\)"):
        load_config(None, doc={**out, "participation": 0.25})


def test_method_fedbug_is_bottom_up_gradual_unfreezing_on_fedavg():
    cfg = load_config(None, doc={"method": "fedbug"})
    assert (cfg.algorithm, cfg.policy, cfg.bottom_up.gu_ratio) == ("fedavg", "bottom_up", 0.4)


def test_units_given_as_tuples_are_accepted_as_lists_are():
    doc = {"model": "mlp", "dataset": "digits"}
    cfg = load_config(None, doc={**doc, "units": ("hidden.0", ("hidden.1", "classifier"))})
    assert cfg.units == ["hidden.0", ["hidden.1", "classifier"]]


@pytest.mark.parametrize("key", ["algorithm", "policy"])
def test_a_method_given_as_an_algorithm_or_policy_says_write_method(key):
    """``algorithm: fedbug`` was answered "did you mean 'fedbabu'?"."""
    with pytest.raises(ConfigError) as exc:
        load_config(None, doc={key: "fedbug"})
    assert f"{key} 'fedbug': fedbug is a method, not a single {key}; write method: fedbug" in str(
        exc.value
    )


@pytest.mark.parametrize("method", ["fedrep", "fedper", "lg_fedavg", "local"])
def test_a_method_without_a_global_model_evaluates_personalized_by_default(method):
    """``-s method=fedrep`` on a config that says nothing of evaluation runs (it was refused:
    its only evaluation is the personalized one); a config that asks for another is refused."""
    assert load_config(None, doc={"method": method}).evaluation == "personalized"
    with pytest.raises(ConfigError, match="needs a global model"):
        load_config(None, doc={"method": method, "evaluation": "global"})
