"""Our own ServerApp: an ordinary Flower server app whose strategy is wrapped in GradientCoding.

``server-optimizer`` picks the inner Flower strategy: ``sgd`` -> ``FedAvg`` (``FedAvgM`` without
momentum when ``server-lr != 1``), ``momentum`` -> ``FedAvgM``, ``adam`` -> ``FedAdam`` (step
``server-lr``); the wrapper decodes the exact example-weighted average of the partitions'
models and hands it to that strategy.

``rival="drop-stragglers"`` runs a baseline instead: Flower's own FedAvg with a round deadline
(``straggler-timeout`` in virtual time) that drops the replies arriving later
(:class:`~fl_gradcode.flower.deadline.DeadlineFedAvg`), on the same seeds and latency draws.
"""

from __future__ import annotations

import math
import random
import time
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, Strategy

from fl_gradcode.codes import GradientCode
from fl_gradcode.codes.cohort import Fallback, code_for_cohort
from fl_gradcode.config import (
    DEFAULTS,
    KEYS,
    charges_sleep,
    client_keys,
    group_values,
    key,
    merge_config,
    worker_list,
)
from fl_gradcode.data import run_partitions
from fl_gradcode.flower import GradientCoding, seeded_sampling
from fl_gradcode.flower.asynchronous import CLASS_RECALL_KEY
from fl_gradcode.flower.code_options import code_options
from fl_gradcode.flower.deadline import DeadlineFedAvg
from fl_gradcode.flower.options import Options
from fl_gradcode.flower.policy import FixedCodePolicy
from fl_gradcode.latency import (
    LATENCY_PARAMETERS,
    LatencyModel,
    make_latency,
    persistent_seed,
)
from fl_gradcode.learning import dp_sgd_steps, evaluate_classes, make_model
from fl_gradcode.privacy import (
    DPConfig,
    PrivacyAccountant,
    ServerNoise,
    independent_noise_multiplier,
)
from fl_gradcode.tasks import fedscale_workload, measured_partition_cost
from server.asynchronous import ASYNCHRONOUS_KEYS
from server.rival_config import FAULT_KEYS, RIVALS, rival_refusal, shared_keys

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")
#: ``fedavg``'s deadline: later than any round (it waits for every reply, as Flower's FedAvg)
NO_DEADLINE = 1e12
#: ``GradientCoding`` keywords that ``DeadlineFedAvg`` (the rival) takes too, with the same
#: meaning.
RIVAL_KEYWORDS = ("latency", "seed", "measured_compute", "compute_cost_s", "upload_bandwidth",
                  "results_dir")
#: ``GradientCoding`` keywords that choose the code (the accountant's independent-noise
#: multiplier depends on it).
CODE_KEYWORDS = ("code", "s", "s_max", "m", "seed")

# Run-config keys the ClientApp needs (the table's client and both sides), forwarded in the
# train config (``run_simulation`` gives ClientApps an empty run config; ``flwr run`` gives them
# the same run config as the server). ``lr`` travels as the train config's own ``lr`` entry.
CLIENT_KEYS = tuple(name for name in client_keys() if name != "lr")


def wait_for_nodes(grid: Grid, want: int, timeout: float = 120.0, settle: float = 3.0) -> int:
    """Number of clients: ``want`` if > 0 (waiting for that many), else the connected count once
    it has been stable for ``settle`` seconds."""
    if want < 0:
        raise ValueError(f"num-clients={want}; expected 0 (one client per connected SuperNode) "
                         "or a positive number of clients")
    t_end = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < t_end:
        count = len(list(grid.get_node_ids()))
        if want > 0 and count >= want:
            return want
        if count != last:
            last, since = count, time.monotonic()
        elif want <= 0 and count > 0 and time.monotonic() - since >= settle:
            return count
        time.sleep(0.2)
    if want > 0:
        raise RuntimeError(f"only {last} SuperNodes connected within {timeout} s; need {want}")
    if last <= 0:
        raise RuntimeError(f"no SuperNode connected within {timeout} s")
    return last


def cohort_size(cfg: dict[str, Any], n: int) -> int:
    """Nodes sampled each round (Flower's ``max(int(n * fraction_train), min_train_nodes)``
    with ``min_train_nodes`` set to the same number)."""
    fraction = float(cfg["fraction-train"])
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction-train={fraction!r} must be in (0, 1]")
    return max(1, int(n * fraction))


def inner_strategy(cfg: dict[str, Any], n: int) -> Strategy:
    """The Flower strategy for ``server-optimizer`` over ``n`` clients, sampling a cohort of
    ``fraction-train`` of the connected nodes each round (all of them by default).

    Flower is asked for one node only (``min_available_nodes = min_train_nodes = 1``): the
    wrapper builds each round's code over the sampled nodes that pass its handshake, and a
    cohort of one decodes, so no number of connected nodes is needed for decoding. While all
    ``n`` nodes are connected the cohorts are those of ``min_train_nodes = cohort_size``
    (Flower samples ``max(int(connected * fraction), min_train_nodes)``); a SuperNode that
    dies shrinks the cohort instead of stalling the job in Flower's "Waiting for nodes to
    connect" loop, which has no timeout. (``run`` still waits for ``num-clients`` nodes at
    the start.)"""
    name = str(cfg["server-optimizer"])
    cohort_size(cfg, n)  # validates fraction-train
    common = {"fraction_train": float(cfg["fraction-train"]), "fraction_evaluate": 0.0,
              "min_available_nodes": 1, "min_train_nodes": 1}
    server_lr = float(cfg["server-lr"])
    if name == "sgd" and server_lr == 1.0:
        return FedAvg(**common)
    if name in ("sgd", "momentum"):
        momentum = float(cfg["momentum"]) if name == "momentum" else 0.0
        return FedAvgM(server_learning_rate=server_lr, server_momentum=momentum, **common)
    if name == "adam":
        return FedAdam(eta=server_lr, **common)
    raise ValueError(f"server-optimizer={name!r}; expected one of {SERVER_OPTIMIZERS}")


def make_accountant(
    dp: DPConfig, keywords: dict[str, Any], n: int, sizes: np.ndarray, cfg: dict[str, Any]
) -> PrivacyAccountant:
    """Opacus-backed accountant for the sampling the run really uses (``keywords``: the
    strategy's, :func:`strategy_keywords`; the accountant is one of them).

    partition / central: every partition is released once per round (sample rate 1) with noise
    multiplier ``sigma``; ``independent`` noise: the server can average a partition's replicas,
    so the effective multiplier is ``independent_noise_multiplier(B, sigma)`` for ``B`` the
    code the strategy builds for the cohort (:class:`~fl_gradcode.flower.FixedCodePolicy`
    of the same code keywords).
    sample: each partition's DP-SGD steps (sample rate ``1/len(loader)``); ε of the worst.
    """
    sigma = dp.noise_multiplier
    if dp.mode == "sample":
        units = []
        for size in sizes.astype(int):
            q, steps = dp_sgd_steps(
                int(size), kind=str(cfg["update"]), epochs=int(cfg["local-epochs"]),
                batch_size=int(cfg["batch-size"]),
            )
            units.append([(sigma, q, steps)])
        return PrivacyAccountant(dp, units)
    if dp.mode == "partition" and dp.noise == "independent":
        # the nominal multiplier judges whether a round fits target-epsilon before its sizes
        # are agreed: the worst case, every partition dominating each reply that holds it
        # (each round is then accounted at its own, example-weighted multiplier, never lower)
        options = Options.from_keywords(**{k: keywords[k] for k in CODE_KEYWORDS})
        if options.code.adaptive:  # the nested placement: s_max + 1 replicas at most
            sigma = sigma / float(np.sqrt(options.adaptive.s_max + 1))
        else:  # the code of the cohort each round samples (all n nodes by default)
            code = FixedCodePolicy(options=options).code_for(cohort_size(cfg, n))
            sigma = independent_noise_multiplier(code.B, sigma, np.full(code.k, np.nan))
    return PrivacyAccountant(dp, [(sigma, 1.0, 1)])


def dp_config(cfg: dict[str, Any]) -> DPConfig:
    """The run's DP parameters (the keys feeding ``DPConfig``)."""
    return DPConfig(**group_values(cfg, "dp"))


def _path_or_none(path: Any) -> str | None:
    """A path key's keyword: the absolute path, or ``None`` for ``""`` (the key's
    ``none_when``)."""
    return str(Path(str(path)).expanduser().resolve()) if path else None


def strategy_keywords(
    cfg: dict[str, Any], n: int, only: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """``GradientCoding``'s keywords for the run config ``cfg`` over ``n`` clients, one per
    table key with a ``keyword`` (``run_config`` aside: :func:`build` adds it), or only the
    keywords in ``only``. Most are the key's value (``None`` for its ``none_when``); the few
    below need more than that."""
    built = {
        "latency": lambda: run_latency(cfg, n),
        "compute_cost_s": lambda: run_partition_cost(cfg, n),
        "results_dir": lambda: _path_or_none(cfg["results-dir"]),
        "latency_state": lambda: _path_or_none(cfg["latency-state"]),
        "roster": lambda: _path_or_none(cfg["roster"]),
        "measured_compute": lambda: str(cfg["virtual-compute"]) == "measured",
        # 0: close a round only when every client replied
        "min_replies": lambda: None if int(cfg["min-replies"]) < 0
        else (int(cfg["min-replies"]) or n),
        "m": lambda: int(cfg["m"]) if str(cfg["code"]) == "comm-efficient" else None,
        "dp": lambda: dp_config(cfg),
        "server_noise": lambda: ServerNoise.from_file(str(cfg["dp-server-key-file"]))
        if cfg["dp-server-key-file"] else None,
    }
    return {
        entry.keyword: built[entry.keyword]() if entry.keyword in built
        else entry.keyword_value(cfg[entry.name])
        for entry in KEYS
        if entry.keyword is not None and (only is None or entry.keyword in only)
    }


def build(cfg: dict[str, Any], n: int, code_policy: Any = None):
    """``(strategy, initial arrays, evaluate_fn, train_config)`` for ``n`` clients
    (``code_policy``: ``GradientCoding``'s keyword, for an experiment's own scheme)."""
    seed = int(cfg["seed"])
    if cfg["asynchronous"]:
        raise ValueError("asynchronous=True: this builds synchronous coded rounds; the "
                         "asynchronous run is server.asynchronous.build_async (the ServerApp's "
                         "run picks it)")
    # read by asynchronous runs only
    for name in ASYNCHRONOUS_KEYS:
        if cfg[name] != DEFAULTS[name]:
            raise ValueError(f"{name}={cfg[name]!r} is read by asynchronous runs only; set "
                             f"asynchronous=true or leave it at {DEFAULTS[name]!r}")
    # Flower's strategies sample each round's cohort with the random module: seeded, the
    # same seed samples the same cohorts (fraction-train < 1)
    random.seed(seed)
    check_dp_keys(cfg)
    check_slow_classes(cfg)
    check_fault_delay(cfg)
    check_fault_workers(cfg, n)
    data, index = run_partitions(cfg, n)
    sizes = np.array([len(p) for p in index], dtype=np.float64)
    keywords = strategy_keywords(cfg, n)
    dp = keywords["dp"]
    if dp.enabled:
        keywords["accountant"] = make_accountant(dp, keywords, n, sizes, cfg)
    strategy = GradientCoding(
        inner_strategy(cfg, n),
        **keywords,
        run_config={**cfg, "num-clients": n, "partition-sizes": sizes.astype(int).tolist()},
        # the federation's partitions: num-clients when the operator set it (a node that never
        # connects is then a straggler of its partition), else the nodes' claims decide
        num_partitions=int(cfg["num-clients"]) or None,
        **({} if code_policy is None else {"code_policy": code_policy}),
    )
    # each round's cohort drawn from (seed, round) over the nodes by id, whatever else draws
    # from the random module: the rival of the same seed samples the same cohorts
    seeded_sampling(strategy, seed)
    initial, evaluate_fn, train_config = model_and_evaluation(cfg, data)
    log(
        INFO,
        "fl-gradcode: %d clients, code %s (s=%s), %s updates, %s timing, dp=%s",
        n, cfg["code"], cfg["s"], cfg["update"], cfg["timing"], dp.mode,
    )
    return strategy, initial, evaluate_fn, train_config


def run_latency(cfg: dict[str, Any], n: int | None = None) -> LatencyModel:
    """The run's latency model (the same draws for every run of one seed); ``latency=fedscale``
    needs the number of clients ``n`` (its tasks' samples per unit of load)."""
    arguments = group_values(cfg, "latency")
    name = arguments.pop("name")
    changed = [k.name for k in KEYS if k.feeds is not None and k.feeds[0] == "latency"
               and k.name in cfg and k.cast(cfg[k.name]) != k.cast(k.default)]
    unread = unread_latency_keys(name, changed)
    if unread:
        raise ValueError(latency_refusal(name, unread[0], cfg[unread[0]]))
    # the federation's fixed traits (who is persistently slow) may outlive the seed
    arguments["seed"] = persistent_seed(arguments["seed"], int(cfg["seed"]))
    if name == "fedscale":
        if n is None:
            raise ValueError("latency='fedscale' needs the number of clients (run_latency(cfg, n))")
        arguments.update(fedscale_workload(cfg, n))
    return make_latency(name, **arguments)


def unread_latency_keys(model: str, names: list[str]) -> list[str]:
    """The run-config keys among ``names`` that feed a latency parameter the latency
    ``model`` does not read (:data:`~fl_gradcode.latency.LATENCY_PARAMETERS`); an unknown
    model is :func:`~fl_gradcode.latency.make_latency`'s to refuse."""
    reads = LATENCY_PARAMETERS.get(model)
    if reads is None:
        return []
    return [name for name in names
            if (feeds := key(name).feeds) is not None and feeds[0] == "latency"
            and feeds[1] != "name" and feeds[1] not in reads]


def latency_refusal(model: str, name: str, value: Any) -> str:
    """Why ``name=value`` is refused under latency ``model`` (it does not read it: the value
    would be recorded as if it applied), naming the keys the model does read."""
    reads = LATENCY_PARAMETERS.get(model, ())
    used = [k.name for k in KEYS if k.feeds and k.feeds[0] == "latency" and k.feeds[1] in reads]
    return (f"{name}={value!r}: latency {model!r} does not read it (it reads "
            f"{', '.join(used) or 'no parameter'}); leave it at its default "
            f"{key(name).default!r} or choose a latency model that reads it")


def cohort_code(code: str, s: int, cohort: int, m: int | None
                ) -> tuple[GradientCode, Fallback | None]:
    """``(code, why)``: the fixed code the ServerApp runs for a cohort of ``cohort`` clients
    (``why``: why it is not ``code`` with ``s`` itself, else ``None``; ``m``: comm-efficient's)."""
    return code_for_cohort(code, cohort, s, 0, code_options(code, s, None, False, None, m))


def check_slow_classes(cfg: dict[str, Any]) -> None:
    """Refuse a ``slow-classes`` run whose meaning would silently change: it gives some classes
    to the clients ``latency=persistent`` slows (each client's own partition), so the slow
    clients must be slower (``latency-slowdown > 1``). Every code the strategy builds has
    one partition per client, so the slow classes stay the slow clients'."""
    classes = int(cfg["slow-classes"])
    if classes == 0:
        return
    if not float(cfg["latency-slowdown"]) > 1:
        raise ValueError(f"slow-classes={classes} gives some classes to the clients slow in "
                         f"every round: it needs latency-slowdown > 1 (got "
                         f"{cfg['latency-slowdown']!r}: they would not be slower)")


def check_fault_delay(cfg: dict[str, Any]) -> None:
    """Refuse a ``slow-delay-s`` that would slow nobody: under virtual timing it is added to
    the reply's measured compute, which only ``virtual-compute=measured`` charges."""
    slow, delay = str(cfg["slow-workers"]).strip(), float(cfg["slow-delay-s"])
    if slow and delay > 0 and not charges_sleep(cfg):
        raise ValueError(f"slow-delay-s={delay!r} for slow-workers={slow!r} is added to the "
                         "measured compute, which virtual-compute="
                         f"{cfg['virtual-compute']!r} does not charge (the workers would not be "
                         "slower); set virtual-compute='measured' or timing='wallclock'")


#: the keys read by differential privacy alone (``dp-run-nonce`` also pins the nonce of the
#: membership and binding seeds, so it is not one)
DP_ONLY_KEYS = (*(k.name for k in KEYS if k.feeds and k.feeds[0] == "dp" and k.name != "dp"),
                "dp-server-key-file")


def check_dp_keys(cfg: dict[str, Any]) -> None:
    """Refuse a DP key set away from its default with ``dp='none'``: a user who set a noise
    multiplier and left ``dp='none'`` would otherwise train without the privacy they asked
    for, and not be told. (Under another mode a key it does not read, such as a server key
    file without ``dp='central'``, weakens nothing and is not refused.)"""
    for name in DP_ONLY_KEYS:
        if cfg[name] == DEFAULTS[name]:
            continue
        if str(cfg["dp"]) == "none":
            raise ValueError(f"{name}={cfg[name]!r} with dp='none', which applies no DP: set dp "
                             "to 'partition', 'central' or 'sample', or leave it at its default "
                             f"({DEFAULTS[name]!r})")


def check_fault_workers(cfg: dict[str, Any], n: int, *, asynchronous: bool = False) -> None:
    """Refuse a ``slow-workers`` or ``nan-workers`` index that names no one: a round's
    workers are ``0 .. cohort - 1``; an asynchronous job names a client by its partition id,
    ``0 .. n - 1``. It would inject nothing."""
    bound = n if asynchronous else cohort_size(cfg, n)
    for name in FAULT_KEYS:
        missing = sorted(w for w in worker_list(str(cfg[name])) if not 0 <= w < bound)
        if not missing:
            continue
        if asynchronous:
            raise ValueError(f"{name}={cfg[name]!r}: no client {missing} among the {n} "
                             f"(asynchronous jobs name a client by its partition id, "
                             f"0..{n - 1}); the fault would inject nothing")
        raise ValueError(f"{name}={cfg[name]!r}: no worker {missing} in a cohort of {bound} "
                         f"(a round's workers are 0..{bound - 1}); the fault would inject "
                         "nothing")


def run_partition_cost(cfg: dict[str, Any], n: int) -> float:
    """``compute_cost_s``: ``partition-cost-s``, or with ``virtual-compute=measured-once`` the
    seconds of one mean-sized partition update, measured now (logged)."""
    if str(cfg["virtual-compute"]) != "measured-once":
        return float(cfg["partition-cost-s"])
    cost = measured_partition_cost(cfg, n)
    log(INFO, "fl-gradcode: measured one partition update (%s, %s): %.4f s per unit of load",
        cfg["model"], cfg["update"], cost)
    return cost


def check_training(cfg: dict[str, Any]) -> None:
    """Refuse, naming it, a training key no run could train with (every client would reply
    NaN or fail, every round be skipped, or no round run): ``lr`` finite and > 0,
    ``local-epochs``, ``batch-size`` and ``num-rounds`` at least 1."""
    lr = float(cfg["lr"])
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr={cfg['lr']!r}: expected a finite step size > 0")
    for name in ("local-epochs", "batch-size", "num-rounds"):
        if int(cfg[name]) < 1:
            raise ValueError(f"{name}={cfg[name]!r}: expected an integer >= 1")


def model_and_evaluation(cfg: dict[str, Any], data: Any, classes: bool = False):
    """``(initial arrays, evaluate_fn, train_config)``: the seeded model, its test accuracy
    and loss (``classes``: and each class's recall, :data:`CLASS_RECALL_KEY`, which a class
    reading needs)."""
    check_training(cfg)
    model = make_model(str(cfg["model"]), data.input_shape, data.num_classes, int(cfg["seed"]))
    initial = ArrayRecord(
        {name: Array(p.detach().numpy().copy()) for name, p in model.named_parameters()}
    )

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        theta = np.concatenate(
            [arrays[name].numpy().reshape(-1) for name, _ in model.named_parameters()]
        )
        loss, acc, recall = evaluate_classes(model, theta, data.x_test, data.y_test,
                                             data.num_classes)
        return MetricRecord({"accuracy": acc, "loss": loss,
                             **({CLASS_RECALL_KEY: recall} if classes else {})})

    train_config = ConfigRecord({"lr": float(cfg["lr"]), **{k: cfg[k] for k in CLIENT_KEYS}})
    return initial, evaluate_fn, train_config


def build_rival(cfg: dict[str, Any], n: int, classes: bool = False):
    """``(strategy, initial arrays, evaluate_fn, train_config)`` of ``rival``: Flower's own
    FedAvg with a round deadline (``straggler-timeout``, virtual time) that drops the replies
    arriving later, on the same seeds, data, model and latency draws as the coded run
    (``classes``: its evaluation returns each class's recall too)."""
    rival = str(cfg["rival"])
    refusal = rival_refusal(cfg, rival)  # what it would not apply, named
    if refusal is not None:
        raise ValueError(refusal)
    seed = int(cfg["seed"])
    random.seed(seed)  # Flower samples cohorts with the random module
    check_dp_keys(cfg)
    check_slow_classes(cfg)
    data, index = run_partitions(cfg, n)
    sizes = [len(p) for p in index]
    cohort_size(cfg, n)  # validates fraction-train
    strategy = DeadlineFedAvg(
        deadline=NO_DEADLINE if rival == "fedavg" else float(cfg["straggler-timeout"]),
        partition_sizes=sizes,
        run_config={**cfg, "num-clients": n, "partition-sizes": sizes},
        # the keywords it shares with GradientCoding, from the same keys
        **strategy_keywords(cfg, n, only=RIVAL_KEYWORDS),
        fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0,
        min_available_nodes=1, min_train_nodes=1,
    )
    seeded_sampling(strategy, seed)  # the coded run's cohorts (build)
    initial, evaluate_fn, train_config = model_and_evaluation(cfg, data, classes)
    if rival == "fedavg":
        log(INFO, "fl-gradcode rival fedavg: %d clients, plain Flower FedAvg waiting for every "
            "reply (%s timing)", n, cfg["timing"])
    else:
        log(INFO, "fl-gradcode rival %s: %d clients, Flower FedAvg with a %.2f s round "
            "deadline (virtual time)", rival, n, strategy.deadline)
    return strategy, initial, evaluate_fn, train_config


def run(grid: Grid, run_config: dict[str, Any]) -> Any:
    """Run a coded job with ``run_config`` (merged over the defaults) on ``grid`` (or, with
    ``rival`` set, that rival: :func:`build_rival`; with ``asynchronous``, FedBuff over
    replicated partitions: :func:`server.asynchronous.build_async`)."""
    cfg = merge_config(run_config)
    n = wait_for_nodes(grid, int(cfg["num-clients"]))
    rounds = int(cfg["num-rounds"])
    if cfg["asynchronous"]:
        from server.asynchronous import build_async

        strategy, initial, evaluate_fn, train_config, rounds = build_async(cfg, n)
    else:
        make = build_rival if cfg["rival"] else build
        strategy, initial, evaluate_fn, train_config = make(cfg, n)
    strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=rounds,
        timeout=float(cfg["round-timeout"]),
        train_config=train_config,
        evaluate_fn=evaluate_fn,
    )
    return strategy


def run_in_process(
    run_config: dict[str, Any],
    n: int,
    *,
    key_file: str | None = None,
    share_updates: bool = True,
    recorded: list | None = None,
    code_policy: Any = None,
) -> tuple[GradientCoding, np.ndarray]:
    """The same job without Ray: the real strategy, mod and ClientApp over an in-process grid,
    in virtual time (honest with 100+ clients on 2 cores). ``key_file``: the clients' DP key
    file; ``share_updates``: replicas in this process share a partition's computed update (each
    is still charged its measured compute); ``recorded`` collects every message the server
    pushes; ``code_policy``: passed to ``GradientCoding``. Returns the strategy and the final
    flat model."""
    from clients.app import fault_injection_mod, make_client_app
    from fl_gradcode.flower import make_gradient_coding_mod
    from fl_gradcode.flower.testing import InProcessGrid

    cfg = merge_config({**run_config, "timing": "virtual", "num-clients": n})
    strategy, initial, evaluate_fn, train_config = build(cfg, n, code_policy)
    cache: dict = {} if share_updates else None
    client_app = make_client_app([fault_injection_mod, make_gradient_coding_mod(cache)])
    grid = InProcessGrid(
        client_app,
        n,
        run_config=cfg,
        node_config=(lambda i: {"dp-key-file": key_file}) if key_file else None,
    )
    if recorded is not None:
        push = grid.push_messages

        def recording_push(messages):
            messages = list(messages)
            recorded.extend(messages)
            return push(messages)

        grid.push_messages = recording_push
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(cfg["num-rounds"]),
        timeout=3600,
        train_config=train_config,
        evaluate_fn=evaluate_fn,
    )
    arrays = result.arrays if len(result.arrays) else initial
    names = list(initial.keys())
    return strategy, np.concatenate([arrays[k].numpy().reshape(-1) for k in names])


def run_rival_in_process(run_config: dict[str, Any], n: int) -> tuple[DeadlineFedAvg,
                                                                      np.ndarray]:
    """:func:`run_in_process` for the rival (``rival`` in the run config; default
    ``drop-stragglers``): Flower's FedAvg with a round deadline (:func:`build_rival`) over the
    in-process grid with the main job's ClientApp (its default mods), in virtual time, on the
    same seeds, data and latency draws as the coded run of the same run config. Returns the
    strategy and the final flat model."""
    from clients.app import make_client_app
    from fl_gradcode.flower.testing import InProcessGrid

    rival = str(run_config.get("rival") or RIVALS[0])
    cfg = merge_config({**shared_keys(run_config), "rival": rival, "timing": "virtual",
                        "num-clients": n})
    strategy, initial, evaluate_fn, train_config = build_rival(cfg, n)
    grid = InProcessGrid(make_client_app(), n, run_config=cfg)
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]),
                            timeout=3600, train_config=train_config, evaluate_fn=evaluate_fn)
    arrays = result.arrays if len(result.arrays) else initial
    names = list(initial.keys())
    return strategy, np.concatenate([arrays[k].numpy().reshape(-1) for k in names])


def make_server_app(overrides: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated with ``overrides``."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run(grid, {**dict(context.run_config), **(overrides or {})})

    return server_app


app = make_server_app()
