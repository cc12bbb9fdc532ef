"""What a node insists on, whatever the server asks: its DP policy and its replay memory.

Everything here comes from the node's own configuration (``context.node_config``: deployment
``flower-supernode --node-config "..."``, simulation: the federation's options), never from
the instruction or the run config, which the server controls.

Node config keys:

* ``dp-required``: ``"none"`` (default: no requirement), ``"central"``, ``"partition"`` or
  ``"sample"``. The DP mode this node insists on. ``central`` accepts a ``central`` or
  ``partition`` instruction (both clip each partition's update; ``partition`` also adds noise
  the server cannot remove); ``partition`` accepts only ``partition``; ``sample`` only
  ``sample``. Any other instruction (in particular ``dp='none'``) is refused.
* ``dp-min-noise-multiplier``: a number ``>= 0`` (default 0). A positive value refuses
  ``dp='none'`` and any instruction whose ``noise-multiplier`` is below it (for ``dp='sample'``
  also a run-config ``noise-multiplier`` below it, the value the app's DP-SGD may read).
* ``dp-state-file``: a file in which the node remembers the ``(nonce, round)`` pairs it has
  answered, across restarts (one line per answered round; locked while read and appended),
  and its release ledger: each line also names the partitions released, the ``dp`` mode, the
  ``noise-multiplier`` and, for ``dp='partition'`` (the one mode whose noise the node adds
  itself), each partition's ε after that release (composed as Opacus' RDP accountant does, at
  ``dp-delta``).
* ``dp-max-releases``: an integer ``>= 1`` (default: no limit). The most releases of any one
  partition this node makes (whatever the nonce); further instructions holding a spent
  partition are refused.
* ``dp-max-epsilon``: a number ``> 0`` (default: no limit). The largest ε (at ``dp-delta``) of
  any one partition's releases by this node; a release that would exceed it is refused, and so
  is any release whose ε the node cannot account (``dp`` ``central`` or ``none``,
  ``noise-multiplier=0``, or ``dp='sample'`` from an app that does not report its DP-SGD
  steps: :mod:`~fl_gradcode.flower.client_ledger`).
* ``dp-delta``: the δ of ``dp-max-epsilon`` and the ledger's ε, in ``(0, 1)`` (default 1e-5).
* ``dp-evaluate``: ``"allow"`` (default) or ``"refuse"``. Evaluate and query messages reach
  the app as they are, and its reply (e.g. a loss on this node's data, for whatever model
  the server sends) carries no noise and counts against no budget; ``"refuse"`` refuses
  them (a node with a DP policy that allows them is warned once).
* ``dp-cut-keys``: the run-config keys the app splits its data by, comma separated
  (default: those of the project's app, :data:`fl_gradcode.data.CUT_KEYS`; ``""``: none).
  A budget counts releases per partition id, so a node with one keeps one cut of its data:
  once it has released under some values of these keys (and some ``num-partitions``), a
  release under others is refused (partition j of another cut holds other records).

What the app sees: when the node has a DP policy or a budget, the app's train config and run
config hold the instruction's ``dp``, ``noise-multiplier`` and ``clip-norm`` (the values the
policy checked and the ledger records), whatever the server's train config says: an app that
reads its DP settings from there (the project's ClientApp does) trains with them. Under
``dp='sample'`` (the app adds the noise) a train config or run config asking the app for
another ``dp`` or for a smaller ``noise-multiplier`` than the node's floor is refused.

Replays: a train instruction whose ``(nonce, round)`` this node has already answered is
refused, not computed, whatever else it asks (another ``noise-multiplier``, ``lr``, ``dp``):
the partition noise and the app's RNG are keyed by ``(key, nonce, round, partition)``, so two
answers with identical keyed noise let the server difference the noise away. Identical
retries are refused too (no reply is stored to be served again). The guard is on whenever
the node has partition keys (its computation then holds secret randomness) or a
``dp-state-file``; without keys every seed is public and a replay reveals nothing the server
cannot compute itself. Without ``dp-state-file`` the memory lasts as long as the mod object
(one process): Flower's deployment engine runs each message in a fresh ClientApp process, so
deployed nodes with keys need ``dp-state-file`` (the mod warns once per mod instance otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..data import CUT_KEYS
from .client_ledger import PolicyError, Release, ReplayGuard, ledger_epsilon
from .protocol import Instruction

__all__ = ["ACCEPTED_MODES", "NodePolicy", "PolicyError", "Release", "ReplayGuard",
           "ledger_epsilon"]

#: ``dp-required`` -> the instruction ``dp`` modes that satisfy it.
ACCEPTED_MODES: dict[str, tuple[str, ...]] = {
    "none": ("none", "partition", "central", "sample"),
    "central": ("central", "partition"),
    "partition": ("partition",),
    "sample": ("sample",),
}

#: ``dp-required`` values whose noise is added on the node: they need a noise multiplier > 0.
LOCAL_NOISE = ("partition", "sample")


@dataclass(frozen=True)
class NodePolicy:
    """The node's DP requirements (node config ``dp-required``, ``dp-min-noise-multiplier``)
    and its release budget (``dp-max-releases``, ``dp-max-epsilon`` at ``dp-delta``; 0: none)."""

    dp_required: str = "none"
    min_noise_multiplier: float = 0.0
    max_releases: int = 0
    max_epsilon: float = 0.0
    delta: float = 1e-5
    #: the app's metric that counts a partition's examples (node config ``dp-weight-key``):
    #: the only one a server may name as the weight, which travels un-noised
    weight_key: str = "num-examples"
    #: the run-config keys the app splits its data by (node config ``dp-cut-keys``)
    cut_keys: tuple[str, ...] = CUT_KEYS
    #: evaluate and query messages (node config ``dp-evaluate``): ``"allow"`` or ``"refuse"``
    evaluate: str = "allow"

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> NodePolicy:
        required = node_config.get("dp-required", "none")
        if required in ("", None):
            required = "none"
        if required not in ACCEPTED_MODES:
            raise ValueError(
                f"node config dp-required={required!r}; expected one of {tuple(ACCEPTED_MODES)}"
            )
        floor = node_config.get("dp-min-noise-multiplier", 0.0)
        if isinstance(floor, str):
            try:
                floor = float(floor)
            except ValueError:
                pass
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (
            math.isfinite(floor) and floor >= 0
        ):
            raise ValueError(
                f"node config dp-min-noise-multiplier={floor!r}; expected a finite number >= 0"
            )
        releases = node_config.get("dp-max-releases", 0)
        if releases in ("", None):
            releases = 0
        if isinstance(releases, str) and releases.strip().isdigit():
            releases = int(releases)
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 0:
            raise ValueError(f"node config dp-max-releases={releases!r}; expected an integer "
                             ">= 1 (or 0: no limit)")
        max_epsilon = _number(node_config, "dp-max-epsilon", 0.0, "a finite number > 0 (or 0: "
                              "no limit)", lambda v: v >= 0)
        delta = _number(node_config, "dp-delta", 1e-5, "a number in (0, 1)",
                        lambda v: 0 < v < 1)
        weight_key = node_config.get("dp-weight-key", "num-examples")
        if not isinstance(weight_key, str) or not weight_key:
            raise ValueError(f"node config dp-weight-key={weight_key!r}; expected the name of "
                             "the app's metric counting a partition's examples")
        cut_keys = node_config.get("dp-cut-keys", None)
        if cut_keys is None:
            cut_keys = CUT_KEYS
        elif isinstance(cut_keys, str):
            cut_keys = tuple(k.strip() for k in cut_keys.split(",") if k.strip())
        else:
            raise ValueError(f"node config dp-cut-keys={cut_keys!r}; expected the run-config "
                             "keys the app splits its data by, comma separated")
        evaluate = node_config.get("dp-evaluate", "allow")
        if evaluate not in ("allow", "refuse"):
            raise ValueError(f"node config dp-evaluate={evaluate!r}; expected 'allow' or "
                             "'refuse'")
        return cls(str(required), float(floor), int(releases), max_epsilon, delta, weight_key,
                   tuple(cut_keys), str(evaluate))

    def check_evaluate(self, message_type: str) -> None:
        """Raise :class:`PolicyError` if this node refuses ``message_type`` (an evaluate or
        query message, whose reply the app sends un-noised)."""
        if self.evaluate == "refuse":
            raise PolicyError(
                f"a {message_type!r} message refused: this node's policy is dp-evaluate="
                "'refuse' (the app's reply to it, e.g. a loss on this node's data for any "
                "model the server sends, would carry no noise)")

    def data_cut(self, run_config: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        """The values (``repr``; ``"absent"``) of the run-config keys the app splits its data
        by: which records each partition holds."""
        return tuple((k, repr(run_config[k]) if k in run_config else "absent")
                     for k in self.cut_keys)

    @property
    def active(self) -> bool:
        return self.dp_required != "none" or self.min_noise_multiplier > 0

    @property
    def floorless(self) -> bool:
        """``dp-required`` adds noise on the node but no amount is set (no floor, no ε cap):
        any positive noise multiplier passes."""
        return (self.dp_required in LOCAL_NOISE and self.min_noise_multiplier == 0
                and self.max_epsilon == 0)

    @property
    def budgeted(self) -> bool:
        return self.max_releases > 0 or self.max_epsilon > 0

    @property
    def governs_app(self) -> bool:
        """Whether the app gets the instruction's DP settings (:meth:`app_view`): under a
        DP requirement, and under a budget, whose ledger records the instruction's."""
        return self.active or self.budgeted

    def app_view(self, instruction: Instruction, train_config: MutableMapping[str, Any],
                 run_config: MutableMapping[str, Any]) -> None:
        """Under a policy that governs the app (:attr:`governs_app`): write the
        instruction's (checked) ``dp``, ``noise-multiplier`` and ``clip-norm`` into the app's
        train config and run config, so an app reading its DP settings from there uses what
        the policy accepted and the ledger records."""
        if not self.governs_app:
            return
        values = {"dp": instruction.dp, "noise-multiplier": float(instruction.noise_multiplier),
                  "clip-norm": float(instruction.clip_norm)}
        train_config.update(values)
        run_config.update(values)

    def check(self, instruction: Instruction, run_config: Mapping[str, Any],
              train_config: Mapping[str, Any] | None = None) -> None:
        """Raise :class:`PolicyError` if ``instruction`` asks for less privacy than this node
        insists on, or (``dp='sample'``: the app adds the noise) the server's train config or
        the run config asks the app for less."""
        mode = instruction.dp
        if mode not in ACCEPTED_MODES[self.dp_required]:
            raise PolicyError(
                f"dp={mode!r} refused: this node's policy is dp-required="
                f"{self.dp_required!r} (accepts dp in {ACCEPTED_MODES[self.dp_required]})"
            )
        guarded = self.active or self.budgeted  # a budget counts releases: the same rules
        if guarded and instruction.weight_key != self.weight_key:
            raise PolicyError(
                f"weight-key={instruction.weight_key!r} refused: a partition's weight is sent "
                f"un-noised, so under this node's policy ({self._describe()}) it is the app's "
                f"example count {self.weight_key!r} (node config dp-weight-key) and no other "
                "metric")
        if mode == "central" and self.min_noise_multiplier > 0 and self.dp_required != "central":
            raise PolicyError(
                "dp='central' refused: the server adds its noise, the node releases its clipped "
                f"update; this node's dp-min-noise-multiplier={self.min_noise_multiplier:g} is "
                "on noise it adds itself (set dp-required='central' to accept the server's)")
        if self.active and mode == "sample":
            self._check_sample_configs(run_config, train_config or {})
        if guarded and mode == "partition" and instruction.dp_noise != "identical":
            # replicas of a partition would release independent draws the server can average
            raise PolicyError(
                f"dp-noise={instruction.dp_noise!r} refused: replicas of a partition would "
                "release independent noise the server can average (sigma/sqrt(r) from r "
                f"replicas); this node's policy is {self._describe()} (dp-noise='identical')")
        if not self._demands_noise:
            return
        if mode == "none":
            raise PolicyError(
                "dp='none' refused: this node's policy is dp-min-noise-multiplier="
                f"{self.min_noise_multiplier:g} (a DP mode with at least that noise)"
            )
        if not self._noise_ok(instruction.noise_multiplier):
            raise PolicyError(
                f"noise-multiplier={instruction.noise_multiplier:g} refused: this node's "
                f"policy is {self._noise_rule()}"
            )

    def _check_sample_configs(self, run_config: Mapping[str, Any],
                              train_config: Mapping[str, Any]) -> None:
        """Under ``dp='sample'`` the app adds the noise from its configs: neither may turn its
        DP-SGD off, nor (where the policy demands noise) set a noise multiplier below it."""
        for where, cfg in (("train config", train_config), ("run config", run_config)):
            if "dp" in cfg and cfg["dp"] != "sample":
                raise PolicyError(
                    f"{where} dp={cfg['dp']!r} refused under dp='sample' (the app's DP-SGD "
                    f"would be off): this node's policy is {self._describe()}")
        if not self._demands_noise:
            return
        for where, cfg in (("run config", run_config), ("train config", train_config)):
            if "noise-multiplier" in cfg and not self._noise_ok(cfg["noise-multiplier"]):
                raise PolicyError(
                    f"{where} noise-multiplier={cfg['noise-multiplier']!r} (the "
                    f"app's DP-SGD noise) refused: this node's policy is "
                    f"{self._noise_rule()}"
                )

    def check_plain_train(self, asked: str, run_config: Mapping[str, Any] | None = None,
                          train_config: Mapping[str, Any] | None = None) -> None:
        """Raise :class:`PolicyError` unless a plain train message (no gradient-coding
        record, which reaches the app as it is) can meet this node's policy: no policy, or
        ``asked`` (the ``dp`` its config asks the app for) is ``"sample"``, the one DP an app
        applies itself (DP-SGD, its noise then checked by :meth:`check_app_config`).
        Partition and central DP are applied by the coding mod to coded work only: the app
        would train and reply without them."""
        if self.budgeted:
            raise PolicyError(
                f"a plain train message (no gradient-coding record) asking dp={asked!r} "
                "refused: this node's release budget "
                f"(dp-max-releases={self.max_releases}, dp-max-epsilon={self.max_epsilon:g}) "
                "counts coded instructions, whose (nonce, round) it records; a plain message "
                "could be asked again and again")
        if not self.active:
            return
        if asked == "sample" and self.dp_required in ("none", "sample"):
            # the app's DP-SGD from the configs it reads, checked as a coded release's are
            self._check_sample_configs(run_config or {}, train_config or {})
            return
        raise PolicyError(
            f"a plain train message (no gradient-coding record) asking dp={asked!r} refused: "
            f"this node's policy is {self._describe()}; partition and central DP are applied "
            "by gradient_coding_mod to coded instructions only (the app would train and reply "
            "without them), and a plain message is accepted only with dp='sample' (the app's "
            "DP-SGD) where the policy allows it")

    def check_app_config(self, config: Mapping[str, Any]) -> None:
        """Raise :class:`PolicyError` if an app's own DP settings (``dp``,
        ``noise-multiplier`` in its merged config) are below this node's policy: what an app
        that reads them from the server's config checks before it trains."""
        if not self.active:
            return
        mode = str(config.get("dp", "none"))
        if mode not in ACCEPTED_MODES[self.dp_required] or (
            mode == "none" and self.min_noise_multiplier > 0
        ):
            raise PolicyError(f"dp={mode!r} refused: this node's policy is {self._describe()}")
        if (mode == "sample" and self._demands_noise
                and not self._noise_ok(config.get("noise-multiplier"))):
            raise PolicyError(
                f"noise-multiplier={config.get('noise-multiplier')!r} (the app's DP-SGD "
                f"noise) refused: this node's policy is {self._describe()}")

    @property
    def _demands_noise(self) -> bool:
        """A noise floor, or noise added on the node (``dp-required`` in
        :data:`LOCAL_NOISE`, which accepts no noise multiplier of 0)."""
        return self.min_noise_multiplier > 0 or self.dp_required in LOCAL_NOISE

    def _noise_ok(self, value: Any) -> bool:
        """Whether ``value`` (a noise multiplier, as given) meets the policy's floor, and is
        above 0 where the noise is added on the node; a non-number never does."""
        try:
            sigma = float(value)
        except (TypeError, ValueError):
            return False
        return sigma >= self.min_noise_multiplier and (
            sigma > 0 or self.dp_required not in LOCAL_NOISE)

    def _noise_rule(self) -> str:
        """The part of the policy a noise multiplier broke, in words."""
        floor = self.min_noise_multiplier
        if floor > 0:
            return f"dp-min-noise-multiplier={floor:g}"
        return f"dp-required={self.dp_required!r} (noise-multiplier > 0)"

    def _describe(self) -> str:
        parts = []
        if self.dp_required != "none":
            parts.append(f"dp-required={self.dp_required!r}")
        if self.min_noise_multiplier > 0:
            parts.append(f"dp-min-noise-multiplier={self.min_noise_multiplier:g}")
        return ", ".join(parts) or "none"


def _number(node_config: Mapping[str, Any], key: str, default: float, expected: str,
            ok: Any) -> float:
    """Node config ``key`` as a float (a numeric string accepted), or ``ValueError`` naming it."""
    value = node_config.get(key, default)
    if value in ("", None):
        return default
    number = value
    if isinstance(number, str):
        try:
            number = float(number)
        except ValueError:
            pass
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not (
        math.isfinite(number) and ok(number)
    ):
        raise ValueError(f"node config {key}={value!r}; expected {expected}")
    return float(number)
