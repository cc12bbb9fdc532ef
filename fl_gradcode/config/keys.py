"""The table of run-config keys: one frozen :class:`Key` per key, in ``pyproject.toml`` order.

Everything else is derived from :data:`KEYS`: :data:`DEFAULTS`, the ``[tool.flwr.app.config]``
check (a test), the keywords the ServerApp passes to ``GradientCoding``, the keys forwarded to
the ClientApp, the keys the main job's rival runs leave out, and the option table in
``docs/options.md`` (:func:`fl_gradcode.config.options_markdown`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "KEYS",
    "KEYWORD_DEFAULTS",
    "SIDES",
    "Key",
    "charges_sleep",
    "client_keys",
    "coded_only_keys",
    "group_values",
    "key",
    "merge_config",
    "worker_list",
]

Side = Literal["server", "client", "both"]
#: Who reads a key: the ServerApp, the ClientApp (forwarded in the train config), or both.
SIDES: tuple[str, ...] = ("server", "client", "both")
#: Groups a key can feed: ``DPConfig``'s fields, ``make_latency``'s arguments, the inner
#: Flower strategy's arguments.
GROUPS: tuple[str, ...] = ("dp", "latency", "inner")
_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Key:
    """One run-config key.

    Attributes:
        name: the kebab-case key.
        default: its value when the run config does not set it (bool, int, float or str).
        help: what it does, one sentence or two (the option table's text).
        keyword: the ``GradientCoding`` keyword it sets, if any.
        side: who reads it (:data:`SIDES`).
        coded_only: it means something to a coded run only (the rival runs drop it).
        choices: the accepted values, when they are a closed list (documentation; the
            component that uses the value refuses others).
        none_when: the run-config value that means the keyword's ``None``.
        also: values of another type also accepted (``"auto"`` for ``s``).
        kind: the type of the key's other values, when the default is one of :attr:`also`
            (``int`` for ``s``, whose default is ``"auto"``); else the default's type.
        feeds: ``(group, argument)`` when it is one argument of a value built from several
            keys (:data:`GROUPS`).
        why_differs: why the default differs from ``GradientCoding``'s signature default
            (empty: they agree).
    """

    name: str
    default: bool | int | float | str
    help: str
    keyword: str | None = None
    side: Side = "server"
    coded_only: bool = False
    choices: tuple[str, ...] = ()
    none_when: bool | int | float | str | None = None
    also: tuple[str, ...] = ()
    feeds: tuple[str, str] | None = None
    why_differs: str = ""
    kind: type | None = None

    @property
    def value_type(self) -> type:
        """The type of the key's values outside :attr:`also` (:attr:`kind`, else the
        default's)."""
        return self.kind if self.kind is not None else type(self.default)

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"run-config key {self.name!r} must be kebab-case")
        if type(self.default) not in (bool, int, float, str):
            raise ValueError(f"{self.name}: default {self.default!r} must be bool/int/float/str")
        if self.side not in SIDES:
            raise ValueError(f"{self.name}: side={self.side!r}; expected one of {SIDES}")
        if self.kind is not None and self.kind not in (bool, int, float, str):
            raise ValueError(f"{self.name}: kind={self.kind!r}; expected bool, int, float or str")
        if self.default in self.also:
            if self.kind is None:
                raise ValueError(f"{self.name}: the default {self.default!r} is one of also="
                                 f"{self.also}: kind (the other values' type) must be given")
        elif type(self.default) is not self.value_type:
            raise ValueError(f"{self.name}: default {self.default!r} is not of kind "
                             f"{self.value_type.__name__}")
        if self.choices and self.default not in self.choices:
            raise ValueError(f"{self.name}: default {self.default!r} not in {self.choices}")
        if self.none_when is not None and type(self.none_when) is not self.value_type:
            raise ValueError(f"{self.name}: none_when={self.none_when!r} must be "
                             f"{self.value_type.__name__} like the key's values")
        if self.feeds is not None and self.feeds[0] not in GROUPS:
            raise ValueError(f"{self.name}: feeds group {self.feeds[0]!r} not in {GROUPS}")
        if self.why_differs and self.keyword is None:
            raise ValueError(f"{self.name}: why_differs needs a keyword to differ from")

    def cast(self, value: Any) -> Any:
        """``value`` converted to :attr:`value_type` (values in :attr:`also` kept as given)."""
        if isinstance(value, str) and value in self.also:
            return value
        return self.value_type(value)

    def keyword_value(self, value: Any) -> Any:
        """The keyword's value for the run-config ``value``: ``None`` for :attr:`none_when`,
        else :meth:`cast`."""
        value = self.cast(value)
        if self.none_when is not None and value == self.none_when:
            return None
        return value


#: Why the main job's regime keys differ from ``GradientCoding``'s defaults: one reason, stated
#: once here and named by each of those keys.
_REGIME = (
    "the main job runs the regime in which the first-hour experiment "
    "(`experiments/first_hour.py`, `results/first_hour.json`, 3 seeds) recommends coding: "
    "about a fifth of the clients slow in every round (slow hardware), compute charged per "
    "partition, `s` chosen every round up to 4 (its round deadline is `straggler-timeout`'s "
    "rule)"
)
_S_DIFFERS = (
    f"{_REGIME}; GradientCoding's default 1 is the smallest fixed tolerance that codes at all "
    "(load 2)"
)

KEYS: tuple[Key, ...] = (
    Key("num-rounds", 30, "rounds"),
    Key("num-clients", 0, "clients; 0 = one per connected SuperNode (the ServerApp waits for "
        "them)"),
    Key("code", "grouped-rs", "gradient code, a registry name (see the codes below); with "
        "`s=auto` an exact code (`nested`, `grouped-rs`, `frc`, `crc`: every round runs the "
        "nested placement's code for the `s` chosen), any other is refused",
        keyword="code", coded_only=True,
        choices=("uncoded", "ignore-stragglers", "frc", "crc", "grouped-rs", "bgc", "expander",
                 "comm-efficient", "nested")),
    Key("s", "auto", "stragglers tolerated per round (an int); `auto`: chosen every round "
        "from the observed latencies", keyword="s", coded_only=True, also=("auto",), kind=int,
        why_differs=_S_DIFFERS),
    Key("s-max", 4, "`s=auto`: the largest tolerance; 0 = `max(1, n // 4)`", keyword="s_max",
        coded_only=True, none_when=0,
        why_differs=f"{_REGIME}; with GradientCoding's None (`max(1, n // 4)` = 3 for 12 "
        "clients) the experiment's coded run ended below drop-stragglers' accuracy on one "
        "seed (regime `persistent-auto`)"),
    Key("auto-margin", 0.2, "`s=auto`: a larger `s` predicted at most this much (relative) "
        "slower is preferred; 0 = pure expected-time minimiser (the default: chosen with "
        "`s-max` by `experiments/grid.toml`'s rule on development seeds, "
        "`python -m experiments.choose_defaults`)", keyword="auto_margin",
        coded_only=True),
    Key("fraction-train", 1.0, "fraction of the nodes sampled each round (Flower's "
        "`fraction_train`); the code is built over each cohort. With DP the accountant still "
        "counts every partition in every round (sample rate 1): an upper bound on ε",
        feeds=("inner", "fraction_train")),
    Key("exclude-slow", 0.0, "`s=auto`: clients estimated at least this many times slower may "
        "be sent nothing for a round, their partitions shared by the rest of their "
        "super-block; 0 = never", keyword="exclude_slow", coded_only=True, none_when=0.0),
    Key("latency-state", "", "`s=auto` (or `busy=fit`): a JSON file of latency observations; "
        "if it exists at start, an earlier run's rounds (matched by data partition) "
        "warm-start the estimator instead of starting at `s_max`; rewritten after every "
        "round; \"\" = none", keyword="latency_state", coded_only=True, none_when=""),
    Key("roster", "", "a JSON file mapping node ids (authenticated by the SuperLink) to "
        "data partition ids: claims it does not state are refused (docs/membership.md); "
        "\"\" = none (the nodes' own claims are cross-checked)", keyword="roster",
        coded_only=True, none_when=""),
    Key("update", "gradient", "`gradient`: one full-batch gradient step per partition; "
        "`local`: `local-epochs` of minibatch SGD", side="both", choices=("gradient", "local")),
    Key("local-epochs", 1, "epochs per partition (`update=local`)", side="both"),
    Key("batch-size", 32, "minibatch size (`update=local`)", side="both"),
    Key("lr", 0.5, "client step: gradient step (`gradient`) / SGD step (`local`); sent as "
        "the train config's `lr`", side="client"),
    Key("server-lr", 1.0, "server step on the decoded FedAvg delta (`FedAvgM`'s "
        "`server_learning_rate`, `FedAdam`'s `eta`)", feeds=("inner", "server_learning_rate")),
    Key("server-optimizer", "sgd", "inner Flower strategy: `sgd` (`FedAvg`), `momentum` "
        "(`FedAvgM`), `adam` (`FedAdam`)", choices=("sgd", "momentum", "adam")),
    Key("momentum", 0.9, "`FedAvgM`'s server momentum (`server-optimizer=momentum`)",
        feeds=("inner", "server_momentum")),
    Key("dataset", "digits", "embedded dataset (`synthetic`: FedProx Synthetic(α, β))",
        side="both", choices=("digits", "mnist1d", "synthetic")),
    Key("synthetic-alpha", 1.0, "FedProx Synthetic(α, β): α", side="both"),
    Key("synthetic-beta", 1.0, "FedProx Synthetic(α, β): β", side="both"),
    Key("model", "logreg", "model (`cnn-large`: the ≥ 100k-parameter CNN of the `mnist1d-cnn` "
        "task, docs/tasks.md)", side="both", choices=("logreg", "mlp", "cnn", "cnn-large")),
    Key("partitioner", "dirichlet", "how the data is split into partitions (`pathological`: "
        "2 classes each; `natural`: log-normal sizes and Dirichlet labels per client)",
        side="both", choices=("iid", "dirichlet", "pathological", "natural")),
    Key("dirichlet-alpha", 0.5, "Dirichlet concentration (`partitioner=dirichlet`; "
        "`natural`: of each client's label distribution)", side="both"),
    Key("natural-sigma", 1.0, "`partitioner=natural`: σ of the log-normal client sizes "
        "(the standard deviation of their logarithm)", side="both"),
    Key("slow-classes", 0, "how many classes (picked from `seed`) only the clients slowed in "
        "every round hold (`latency=persistent`; partition j is client j's): every example of "
        "them is split among the slow clients, the rest among the others by `partitioner`; "
        "0 = data unrelated to speed (every code keeps one partition per client, so the "
        "slow classes stay the slow clients')", side="both"),
    Key("latency", "persistent", "simulated latency model (`persistent`: the same fraction "
        "`latency-p` of the clients slowed `latency-slowdown` times every round; `drift`: "
        "Pareto, then load-scaled bimodal; `fedscale`: FedScale-format device traces, "
        "`latency-device-trace`). A `latency-*` parameter the model does not read, set away "
        "from its default, is refused", keyword="latency", feeds=("latency", "name"), side="both",
        choices=("none", "exponential", "shifted-exponential", "pareto", "bimodal",
                 "persistent", "trace", "drift", "fedscale"),
        why_differs=f"{_REGIME}; GradientCoding's None simulates no stragglers (a real "
        "deployment's own timing)"),
    Key("latency-scale", 0.1, "per partition of load: `load·(scale + Exp(rate))`; the Pareto "
        "scale", feeds=("latency", "scale")),
    Key("latency-rate", 10.0, "rate of the exponential part", feeds=("latency", "rate")),
    Key("latency-shape", 2.0, "Pareto shape (`pareto`: `scale·Pareto(shape)`, "
        "load-independent)", feeds=("latency", "shape")),
    Key("latency-p", 0.2, "fraction of clients slowed (`bimodal`, `persistent`)",
        feeds=("latency", "p"), side="both"),
    Key("latency-slowdown", 20.0, "slowdown factor (`bimodal`, `persistent`)",
        feeds=("latency", "slowdown")),
    Key("latency-trace", "canada", "bundled AWS Lambda trace (`canada`, `london`, `sydney`, "
        "`tokyo`, `sydney-20rounds*`)", feeds=("latency", "trace")),
    Key("latency-drift-round", 15, "`drift`: the round at which the regime changes",
        feeds=("latency", "drift_round")),
    Key("latency-device-trace", "generated", "`fedscale`: `generated` (devices drawn from "
        "`latency-seed` by the stated fit, docs/tasks.md) or the path of a directory holding "
        "FedScale's `client_device_capacity` (and optionally `client_behave_trace`) pickles",
        feeds=("latency", "device_trace")),
    Key("latency-round-s", 60.0, "`fedscale`, where no clock is kept (the order-statistic "
        "theory's draws): round r starts r times this many seconds into the devices' "
        "availability cycle; runs read the cycle at each round's virtual start",
        feeds=("latency", "round_s")),
    Key("latency-seed", -1, "`persistent`: the seed that picks the persistently slow clients "
        "(the federation's hardware), so runs with different `seed`s can share them; "
        "-1 = `seed`. Per-round draws always follow `seed`", feeds=("latency", "seed"),
        side="both"),
    Key("virtual-compute", "none", "`measured`: add each client's measured compute time "
        "to its virtual arrival; `none`: do not (`partition-cost-s` charges it instead); "
        "`measured-once`: time one mean-sized partition's update at the start of the run "
        "and charge that per unit of load (in place of `partition-cost-s`)",
        keyword="measured_compute", choices=("measured", "none", "measured-once"),
        why_differs=f"{_REGIME}; a charged cost, unlike GradientCoding's measured compute, "
        "does not vary with the machine's load, so two runs of the main job agree"),
    Key("partition-cost-s", 0.05, "modelled compute seconds per unit of load (a client's "
        "examples over one client's share)", keyword="compute_cost_s",
        why_differs=f"{_REGIME}; GradientCoding's 0 would make a coded client's `s+1` "
        "partitions free"),
    Key("busy", "", "`skip`, `queue` or `fit` the work of a client still busy with an "
        "earlier round (virtual timing); \"\": `queue` with `s=auto`, `skip` otherwise",
        keyword="busy", coded_only=True, none_when="", choices=("", "skip", "queue", "fit")),
    Key("upload-bandwidth", 0.0, "virtual timing: each client's upload rate in bytes/s; a "
        "reply arrives `bytes / bandwidth` later (0: instantaneous)",
        keyword="upload_bandwidth", none_when=0.0),
    Key("m", 1, "`code=comm-efficient`: every reply is `1/m` of the model (load `s + m` "
        "partitions); if `s + m` does not divide the cohort, the leftover clients join "
        "groups, whose members then compute their group's `s + m + 1` or more partitions "
        "(every client keeps its own partition); ignored by the other codes (`code=comm-efficient` "
        "with `s=auto` is refused)",
        keyword="m", coded_only=True),
    Key("timing", "virtual", "`virtual`: arrivals on a simulated clock; `wallclock`: real "
        "time", keyword="timing", choices=("virtual", "wallclock")),
    Key("straggler-timeout", 5.93, "seconds (virtual or wall) before approximate decoding "
        "(the rival's round deadline)", keyword="straggler_timeout",
        why_differs="the main job's deadline, by the rule of `experiments/grid.toml` "
        "(`main_job_deadline_digits`): its stated deadline rule (`deadline_slack` times the "
        "`deadline_quantile` quantile of wait-for-all's client times) on the development "
        "seeds in the main job's own setting "
        "(`results/main_job_deadline.json`); GradientCoding's `10.0` has no rule behind it"),
    Key("stop-late-work", "auto", "workers stop at the round's deadline instead of finishing "
        "work the server can no longer use; `auto`: with `s=auto` when busy clients are "
        "given queued work (virtual timing), else not (queued work behind stale work "
        "otherwise snowballs when deadlines bind); `decode` (virtual timing): at the "
        "round's end, its decode or its deadline, whichever is first",
        keyword="stop_late_work", coded_only=True, also=("auto", "decode"), kind=bool),
    Key("auto-deadline", 0.0, "`s=auto` (or `busy=fit`), virtual timing: each round's "
        "deadline is this factor (≥ 1) times its predicted time (never beyond "
        "`straggler-timeout`), and work stops there; 0 = off", keyword="auto_deadline",
        coded_only=True, none_when=0.0),
    Key("auto-approximate", False, "`s=auto`, virtual timing: a round may also decode what "
        "arrived by a deadline when that is predicted cheaper per unit of progress (round "
        "time over one minus the update's relative error, measured in exact rounds; "
        "docs/adaptive.md)", keyword="auto_approximate", coded_only=True),
    Key("max-decode-error", 0.5, "quality bar for applying an approximate decoding (its "
        "relative error over partitions, unweighted by their examples)",
        keyword="max_decode_error", coded_only=True),
    Key("min-replies", -1, "also close a round at this many replies (approximate decode); "
        "-1: `n − s` for approximate codes, none for exact codes; 0: every client",
        keyword="min_replies", coded_only=True),
    Key("verify", False, "check every round's replies against secret dense probes before "
        "applying a decoding: only groups whose s + 1 replicas agree are decoded, so up to s "
        "colluders can neither get a forged model applied nor an honest node blamed "
        "(docs/integrity.md); refused for codes without repetition groups (use frc)",
        keyword="verify", coded_only=True),
    Key("verify-tolerance", 1e-5, "`verify`: relative disagreement between replicas tolerated "
        "as rounding", keyword="verify_tolerance", coded_only=True),
    Key("round-timeout", 600.0, "wall-clock safety limit of a round (seconds); `asynchronous`: "
        "of a job (then given up) and of the wait for a usable update (then the run stops)",
        keyword="round_timeout"),
    Key("warmup-timeout", 120.0, "wall-clock limit for the first reply of round 1 (seconds); "
        "`asynchronous`: for the nodes' identification (a node silent by then gets no job)",
        keyword="warmup_timeout", coded_only=True),
    Key("slow-workers", "", "fault injection: comma-separated workers slowed by "
        "`slow-delay-s`", side="client"),
    Key("slow-delay-s", 0.0, "fault injection: seconds added to a slow worker", side="client"),
    Key("nan-workers", "", "fault injection: comma-separated workers whose replies hold a NaN",
        side="client"),
    Key("dp", "none", "differential privacy: `partition`, `central`, `sample` (record-level "
        "DP-SGD)", keyword="dp", side="both", feeds=("dp", "mode"),
        choices=("none", "partition", "central", "sample"),
        why_differs="the app always passes a DPConfig; with mode 'none' it means what "
        "GradientCoding's None means: no DP"),
    Key("clip-norm", 1.0, "clipping bound `C`", side="both", feeds=("dp", "clip_norm")),
    Key("noise-multiplier", 1.0, "noise multiplier `σ`", side="both",
        feeds=("dp", "noise_multiplier")),
    Key("dp-noise", "identical", "`identical` (replica-identical, keyed) or `independent` "
        "(failure mode)", feeds=("dp", "noise"), choices=("identical", "independent")),
    Key("delta", 1e-5, "ε is reported at this δ", feeds=("dp", "delta")),
    Key("accountant", "rdp", "Opacus accountant for ε", feeds=("dp", "accountant"),
        choices=("rdp", "prv")),
    Key("target-epsilon", 0.0, "stop before ε would exceed it (0 = no budget)",
        feeds=("dp", "target_epsilon")),
    Key("dp-run-nonce", "", "pins the per-run nonce of every keyed seed; empty = fresh per run "
        "(pinning reuses noise across runs with the same key)", keyword="dp_run_nonce"),
    Key("dp-server-key-file", "", "`dp=central`: a server-side key file for reproducible "
        "server noise; empty = OS randomness", keyword="server_noise", none_when=""),
    Key("seed", 0, "every random choice", keyword="seed", side="both"),
    Key("results-dir", "results/run", "output directory; \"\" = no results files",
        keyword="results_dir", none_when="",
        why_differs="the app writes its results files; GradientCoding's None writes none"),
    Key("rival", "", "`drop-stragglers`: run Flower's own FedAvg with the round deadline "
        "`straggler-timeout` (virtual time), dropping later replies, instead of the coded "
        "job (needs `dp=none`, `server-optimizer=sgd`, `server-lr=1.0`, virtual timing); "
        "`fedavg`: plain Flower FedAvg waiting for every reply (the same needs but any "
        "timing; wallclock needs `latency=none`). Either refuses `slow-workers` and "
        "`nan-workers` (injected into coded messages only); `drop-stragglers` also refuses "
        "a coded-only key away from its default",
        coded_only=True, choices=("", "drop-stragglers", "fedavg")),
    Key("asynchronous", False, "run FedBuff (buffered asynchronous aggregation, Nguyen et al. "
        "2022) over partitions each held by `s + 1` clients instead of synchronous rounds: "
        "`s` an int (0: FedBuff itself) or `auto` (s = 1 with the replication rule picked "
        "on development seeds), each job the held partition served least so far (below the "
        "bar: see `replicate-below`), the "
        "cohort (`fraction-train`) in flight, a server step of `server-lr` every "
        "`buffer-size` updates, `num-rounds` times the cohort updates in all; virtual or "
        "wallclock timing. Needs `dp=none`, `server-optimizer=sgd`, and every key of "
        "synchronous rounds at its default", coded_only=True),
    Key("replicate-below", 1.0, "`asynchronous`: a client computes a neighbour's partition "
        "only while that partition's jobs are fewer than this times its own partition's "
        "(1: the least served held partition, always; 0: its own, FedBuff); `s='auto'` sets "
        "its own", coded_only=True),
    Key("replicate-margin", 0.0, "`asynchronous`: and only while the client's own partition's "
        "jobs lead that partition's by more than this many standard deviations of a "
        "difference of two counts of one rate (`own - theirs > z * sqrt(own + theirs)`; 0: "
        "the bar alone); `s='auto'` sets its own", coded_only=True),
    Key("need-ratio", 0.0, "`asynchronous`: a neighbour's partition whose last update (its "
        "model delta) was more than this many times as large as the client's own partition's "
        "last update (or, by `need-reference`, whose recent updates were as large against "
        "their era's) is served as much as the own partition, the others below "
        "`replicate-below` (0: off); `s='auto'` sets its own", coded_only=True),
    Key("need-latch", False, "`asynchronous` with `need-ratio`: a partition once seen to be "
        "needed is served as much as the own partition for the rest of the run; `s='auto'` "
        "sets its own", coded_only=True),
    Key("need-reference", "own", "`asynchronous` with `need-ratio`: what a neighbour's "
        "partition's update is compared with: `own`, its holder's own partition's last update; "
        "`era`, the median of the updates computed from models of the same era (its server "
        "step and the two before), smoothed over the partition's last three; `cohort`, the "
        "same over its step and the ceil(cohort / K) before; `s='auto'` sets its own",
        coded_only=True),
    Key("need-prior", False, "`asynchronous` with `need-reference='cohort'`: a partition "
        "read fewer than twice is served as if needed; `s='auto'` sets its own",
        coded_only=True),
    Key("lag-level", 0.0, "`asynchronous`: once the median class recall of the server's "
        "evaluation is at least this while some class's best recall so far is below 0.1 "
        "(a class never learnt), every held partition is served as much as the own one for "
        "the rest of the run, the bar `replicate-below` before (0: off; needs an evaluation "
        "that returns `class-recall`, as this project's does); `s='auto'` sets its own",
        coded_only=True),
    Key("buffer-size", 0, "`asynchronous`: updates per server step (FedBuff's K); 0 = a "
        "quarter of the cohort, rounded up (the benchmark's a-priori K)", coded_only=True),
)

_BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
if len(_BY_NAME) != len(KEYS):
    raise ValueError("a run-config key appears twice in KEYS")

#: Every key's default, in table order.
DEFAULTS: dict[str, Any] = {k.name: k.default for k in KEYS}

#: ``GradientCoding`` keyword -> its default, declared once as the default of the key that sets
#: it (``None`` for the key's :attr:`~Key.none_when`); only keys whose default is the keyword's
#: (no :attr:`~Key.why_differs`: where they differ, the option group declares its own). The
#: option groups (:mod:`fl_gradcode.flower.options`) read their defaults from here.
KEYWORD_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    k.keyword: k.keyword_value(k.default) for k in KEYS
    if k.keyword is not None and not k.why_differs})


def key(name: str) -> Key:
    """The table entry of run-config key ``name`` (``KeyError`` if there is none)."""
    return _BY_NAME[name]


def client_keys() -> tuple[str, ...]:
    """Keys the ClientApp reads (side ``client`` or ``both``), in table order."""
    return tuple(k.name for k in KEYS if k.side in ("client", "both"))


def coded_only_keys() -> tuple[str, ...]:
    """Keys that only mean something to a coded run, in table order."""
    return tuple(k.name for k in KEYS if k.coded_only)


def group_values(cfg: Mapping[str, Any], group: str) -> dict[str, Any]:
    """``{argument: value}`` of the keys feeding ``group`` (e.g. ``DPConfig``'s fields for
    ``"dp"``), each value cast to its default's type."""
    if group not in GROUPS:
        raise ValueError(f"group={group!r}; expected one of {GROUPS}")
    return {k.feeds[1]: k.cast(cfg[k.name]) for k in KEYS
            if k.feeds is not None and k.feeds[0] == group}


def merge_config(run_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults overridden by ``run_config``; unknown keys raise a ``ValueError`` naming them."""
    cfg = dict(DEFAULTS)
    for name, value in (run_config or {}).items():
        if name not in _BY_NAME:
            raise ValueError(f"unknown run-config key {name!r}; known keys: {sorted(DEFAULTS)}")
        entry = _BY_NAME[name]
        kind = entry.value_type
        if isinstance(value, str) and value in entry.also:
            cfg[name] = value
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            also = "".join(f" or {a!r}" for a in entry.also)
            raise ValueError(
                f"run-config {name}={value!r} must be {kind.__name__}{also} like its default "
                f"{entry.default!r}"
            )
        cfg[name] = value
    return cfg


def charges_sleep(cfg: Mapping[str, Any]) -> bool:
    """Whether a run with the merged run config ``cfg`` sees a client sleep (a fault's delay,
    a slow node's): wallclock timing, or virtual timing that charges the measured compute
    (``virtual-compute = "measured"``)."""
    return str(cfg["timing"]) != "virtual" or str(cfg["virtual-compute"]) == "measured"


def worker_list(text: str) -> set[int]:
    """``"1,4"`` -> ``{1, 4}`` (for ``slow-workers`` / ``nan-workers``)."""
    try:
        return {int(x) for x in str(text).replace(" ", "").split(",") if x}
    except ValueError as exc:
        raise ValueError(f"expected comma-separated worker indices; got {text!r}") from exc
