"""Differential privacy composed with gradient coding (no Flower import).

Mechanisms (run-config key ``dp``):

* ``partition`` (local DP per partition): every holder of partition ``j`` clips ``u_j`` to
  ``C`` and adds the SAME Gaussian noise ``n_j ~ N(0, (sigma C)^2 I)``, drawn in float64 from a
  generator seeded by ``HMAC-SHA256(key_j, "round=r;partition=j")``. ``key_j`` is a secret the
  holders of ``j`` get from client-side configuration (a key file), never from the server.
  Exact decoding then returns ``sum_j w_j (clip(u_j) + n_j)`` for every straggler pattern.
* ``central`` (trusted server): clients clip; the server adds noise once after decoding, with
  std ``sigma * C * max_j |alpha_j w_j|`` (the decoded sum's sensitivity to one partition when
  approximate decoding weights ``alpha`` differ from 1).
* ``sample`` (record-level DP-SGD inside each partition, Opacus), seeded the same way.
* ``dp-noise=independent`` shows the failure mode: each replica draws its own noise; decoded
  variance ``sigma^2 C^2 sum_i a_i^2 ||B_i w||^2`` instead of ``sigma^2 C^2 sum_j w_j^2``.

Accounting uses Opacus' accountants (RDP or PRV): one Sampled Gaussian Mechanism step per round
for partition-level DP (``q = 1``: every partition contributes every round), or the DP-SGD steps
of each partition for record-level DP.

References:
    McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models",
    ICLR 2018, https://arxiv.org/abs/1710.06963 (partition/user-level clipping and noise).
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016,
    https://arxiv.org/abs/1607.00133 (DP-SGD, moments accountant).
    Mironov, "Renyi Differential Privacy", CSF 2017; Gopi, Lee, Wutschitz, "Numerical
    Composition of Differential Privacy", NeurIPS 2021 (PRV accountant).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DP_MODES",
    "DP_NOISE",
    "KEYED_MODES",
    "MIN_CLIP_NORM",
    "SAMPLE_RATE_METRIC",
    "STEPS_METRIC",
    "CentralDP",
    "DPConfig",
    "Mechanism",
    "NoiseKeys",
    "PartitionDP",
    "PrivacyAccountant",
    "ServerNoise",
    "clip",
    "decoded_noise_variance",
    "gaussian_epsilon",
    "independent_noise_multiplier",
    "make_mechanism",
    "noise_seed",
    "normal_clip_norm",
    "partition_noise",
    "sgm_epsilon",
    "write_key_file",
]

DP_MODES = ("none", "partition", "central", "sample")
DP_NOISE = ("identical", "independent")
#: dp modes whose client-side randomness must come from partition keys.
KEYED_MODES = ("partition", "sample")
KEY_FILE_ENV = "FL_GRADCODE_DP_KEY_FILE"


@dataclass(frozen=True)
class DPConfig:
    """Public DP parameters (the server may know all of these; keys are separate)."""

    mode: str = "none"
    clip_norm: float = 1.0
    noise_multiplier: float = 1.0
    noise: str = "identical"
    delta: float = 1e-5
    accountant: str = "rdp"
    target_epsilon: float = 0.0  # 0: no budget

    def __post_init__(self) -> None:
        if self.mode not in DP_MODES:
            raise ValueError(f"dp={self.mode!r}; expected one of {DP_MODES}")
        if self.noise not in DP_NOISE:
            raise ValueError(f"dp-noise={self.noise!r}; expected one of {DP_NOISE}")
        normal_clip_norm(self.clip_norm)
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise ValueError(f"noise-multiplier={self.noise_multiplier!r} must be >= 0")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta={self.delta!r} must be in (0, 1)")
        if self.accountant not in ("rdp", "prv"):
            raise ValueError(f"accountant={self.accountant!r}; expected 'rdp' or 'prv'")
        if not self.target_epsilon >= 0:
            raise ValueError(f"target-epsilon={self.target_epsilon!r} must be >= 0 (0 = none)")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


#: The smallest clipping bound a release takes (the smallest normal float64): below it ``C``
#: itself is subnormal and scaling by it rounds a clipped vector's norm up to twice ``C``.
MIN_CLIP_NORM = float(np.finfo(np.float64).tiny)


def normal_clip_norm(value: float) -> float:
    """``value``, refused by name unless finite and at least :data:`MIN_CLIP_NORM` (a subnormal
    clip norm: clipping to it rounds a norm up to about twice it, which the noise, sized for
    it, does not cover)."""
    if not (math.isfinite(value) and value >= MIN_CLIP_NORM):
        raise ValueError(f"clip-norm={value!r}; expected a finite number >= {MIN_CLIP_NORM:g} "
                         "(the smallest normal float)")
    return value


def clip(u: np.ndarray, clip_norm: float) -> np.ndarray:
    """``u * min(1, C / ||u||)``: the result's norm is at most ``C`` (up to rounding, for a
    normal ``C``; a ratio ``C / ||u||`` too small for a normal float scales in two steps).

    A ``u`` with a non-finite entry (a computation that overflowed) is clipped to the zero
    vector: its norm is within ``C`` as every release's must be. Released as it came, a NaN
    passes through the noise, and a server choosing a model on which one record's update
    overflows would read that record's membership exactly."""
    u = np.asarray(u, dtype=np.float64)
    if not np.isfinite(u).all():
        return np.zeros_like(u)
    norm = float(np.linalg.norm(u))
    if norm <= clip_norm or norm == 0.0:
        return u.copy()
    scale = clip_norm / norm
    if scale < MIN_CLIP_NORM:  # subnormal: its few significant bits would round the norm up
        return (u / norm) * clip_norm
    return u * scale


def noise_seed(
    key: bytes, server_round: int, partition: int, purpose: str = "noise", nonce: str = ""
) -> int:
    """64-bit seed ``HMAC-SHA256(key, "[nonce=N;]round=r;partition=j[;purpose]")``.

    ``nonce`` is the run's nonce: with a fresh nonce per run, two runs with the same key never
    draw the same noise (otherwise subtracting their releases would cancel it)."""
    tag = f"round={int(server_round)};partition={int(partition)}"
    if nonce:
        tag = f"nonce={nonce};{tag}"
    if purpose != "noise":
        tag += f";purpose={purpose}"
    digest = hmac.new(key, tag.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "little")


def partition_noise(
    key: bytes,
    server_round: int,
    partition: int,
    dim: int,
    std: float,
    purpose: str = "noise",
    nonce: str = "",
):
    """Replica-identical Gaussian noise: float64 PCG64 draws, identical on every CPU and thread
    count. A ``purpose`` other than ``"noise"`` gives an independent stream (e.g.
    ``"replica=w"`` for the independent-noise failure mode)."""
    seed = noise_seed(key, server_round, partition, purpose=purpose, nonce=nonce)
    return std * np.random.Generator(np.random.PCG64(seed)).standard_normal(dim)


class NoiseKeys:
    """Client-side partition keys, loaded from a key file the server never sees.

    The file is JSON: ``{"master": "<hex>"}`` (each partition key is
    ``HMAC-SHA256(master, "partition=j")``: simplest, but every key-holder can derive every
    partition's key) or ``{"partitions": {"0": "<hex>", ...}}`` (each client gets only the keys
    of the partitions it holds). The path comes from the node config (``dp-key-file``) or the
    environment variable ``FL_GRADCODE_DP_KEY_FILE``.
    """

    def __init__(self, master: bytes | None = None, partitions: Mapping[int, bytes] | None = None):
        if master is None and not partitions:
            raise ValueError("NoiseKeys needs a master key or per-partition keys")
        self._master = master
        self._partitions = dict(partitions or {})

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> NoiseKeys:
        data = json.loads(Path(path).read_text())
        if "master" in data:
            return cls(master=bytes.fromhex(data["master"]))
        if "partitions" in data:
            return cls(partitions={int(j): bytes.fromhex(h) for j, h in data["partitions"].items()})
        raise ValueError(f"key file {path} has neither 'master' nor 'partitions'")

    @classmethod
    def from_config(cls, node_config: Mapping[str, object]) -> NoiseKeys:
        path = node_config.get("dp-key-file") or os.environ.get(KEY_FILE_ENV)
        if not path:
            raise ValueError(
                "dp needs partition keys on the client: set node config 'dp-key-file' or the "
                f"environment variable {KEY_FILE_ENV} (create one with "
                "`python -m fl_gradcode.privacy keygen FILE`)"
            )
        return cls.from_file(str(path))

    def key(self, partition: int) -> bytes:
        if partition in self._partitions:
            return self._partitions[partition]
        if self._master is None:
            raise ValueError(f"this client has no key for partition {partition}")
        return hmac.new(self._master, f"partition={partition}".encode(), hashlib.sha256).digest()


def write_key_file(path: str | os.PathLike, partitions: Iterable[int] | None = None) -> Path:
    """Create a key file with a fresh 256-bit master key (or per-partition keys), mode 0600."""
    path = Path(path)
    if partitions is None:
        data = {"master": secrets.token_hex(32)}
    else:
        data = {"partitions": {str(j): secrets.token_hex(32) for j in partitions}}
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def decoded_noise_variance(
    B: np.ndarray,
    weights: np.ndarray,
    coefficients: np.ndarray,
    alpha: np.ndarray,
    std: float,
    noise: str,
) -> float:
    """Per-coordinate variance of the noise in the decoded sum.

    identical: ``std^2 sum_j (alpha_j w_j)^2`` (``std^2 k`` for exact decoding, unit weights);
    independent: ``std^2 sum_i a_i^2 ||B_i * w||^2`` (each replica's own noise).
    """
    if noise == "identical":
        return float(std**2 * np.sum((alpha * weights) ** 2))
    rows = np.sum((B * weights) ** 2, axis=1)
    return float(std**2 * np.sum(coefficients**2 * rows))


def independent_noise_multiplier(B: np.ndarray, sigma: float,
                                 sizes: np.ndarray | None = None) -> float:
    """Effective noise multiplier of the worst partition when each replica adds its own noise
    to every partition it holds and the server sees every reply:
    ``sigma / sqrt(max_j sum_i W_ij^2 / ||W_i||^2)`` with ``W_ij = B_ij n_j``, the weight
    reply ``i`` gives partition ``j``'s release (its example count ``n_j`` times the code's
    coefficient; Tandon et al., ICML 2017, for ``B``). That is the best unbiased estimate of
    a partition's update from the replies (generalised least squares): reply ``i``'s noise
    has variance ``sigma^2 C^2 ||W_i||^2`` and carries ``W_ij`` of partition ``j``.

    ``sizes`` (the ``n_j``, one per column of ``B``; ``None``: equal): a partition of unknown
    size (NaN) is taken to dominate each reply holding it (its share 1 there), and is left
    out of the other partitions' ``||W_i||`` (size 0): the worst case for both. With equal
    sizes FRC gives exactly ``sigma`` (each of the ``s+1`` copies of a group sum carries
    ``s+1`` noise terms, so averaging them leaves variance ``sd^2``); unequal sizes or
    coefficients (CRC) can give less."""
    B = np.asarray(B, dtype=np.float64)
    n = np.ones(B.shape[1]) if sizes is None else np.asarray(sizes, dtype=np.float64)
    if n.shape != (B.shape[1],) or np.any(n[np.isfinite(n)] < 0):
        raise ValueError(f"sizes={sizes!r}: expected {B.shape[1]} example counts >= 0 (NaN: "
                         "unknown)")
    unknown = ~np.isfinite(n)
    W2 = (B * np.where(unknown, 0.0, n)[None, :]) ** 2
    row = W2.sum(axis=1, keepdims=True)
    share = np.where(row > 0, W2 / np.where(row > 0, row, 1.0), 0.0)
    share[:, unknown] = (B[:, unknown] != 0).astype(np.float64)
    worst = float(np.max(share.sum(axis=0)))
    return float(sigma / math.sqrt(worst)) if worst > 0 else float(sigma)


class Mechanism:
    """The DP mechanism of one mode, used by both sides: ``release`` on the client (per
    partition update, before encoding) and ``server_noise_std`` on the server (after decoding).

    Build one with :func:`make_mechanism`; the base class is ``dp="none"`` and ``"sample"``
    (record-level noise lives inside the app's training, e.g. Opacus DP-SGD).
    """

    def __init__(self, config: DPConfig) -> None:
        self.config = config

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def needs_keys(self) -> bool:
        """Whether clients need partition keys (keyed noise or keyed sampling)."""
        return self.mode in ("partition", "sample")

    def release(
        self,
        update: np.ndarray,
        *,
        keys: NoiseKeys | None,
        partition: int,
        server_round: int,
        nonce: str,
        worker: int,
    ) -> np.ndarray:
        """Partition ``partition``'s update as the client may release it (float64)."""
        return np.asarray(update, dtype=np.float64)

    def server_noise_std(self, scale: float) -> float:
        """Std of the noise the server adds to the decoded result (``scale``: the largest
        weight one partition has in it)."""
        return 0.0


class PartitionDP(Mechanism):
    """Clip each partition update to ``C`` and add keyed Gaussian noise ``N(0, (sigma C)^2)``,
    identical at every replica (``dp-noise=identical``) or per replica (the failure mode).

    References:
        McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language
        Models", ICLR 2018, https://arxiv.org/abs/1710.06963.
    """

    def release(self, update, *, keys, partition, server_round, nonce, worker):
        if keys is None:
            raise ValueError("dp='partition' needs partition keys on the client")
        cfg = self.config
        clipped = clip(update, cfg.clip_norm)
        purpose = f"replica={worker}" if cfg.noise == "independent" else "noise"
        std = cfg.noise_multiplier * cfg.clip_norm
        noise = partition_noise(
            keys.key(partition), server_round, partition, clipped.size, std, purpose, nonce
        )
        return clipped + noise


class CentralDP(Mechanism):
    """Clients clip; the trusted server adds ``N(0, (sigma C scale)^2)`` once after decoding,
    drawn from a server-side secret (:class:`ServerNoise`)."""

    def release(self, update, *, keys, partition, server_round, nonce, worker):
        return clip(update, self.config.clip_norm)

    def server_noise_std(self, scale: float) -> float:
        return self.config.noise_multiplier * self.config.clip_norm * float(scale)


def make_mechanism(config: DPConfig | None) -> Mechanism:
    """The mechanism object of ``config.mode``."""
    config = config or DPConfig()
    cls = {"partition": PartitionDP, "central": CentralDP}.get(config.mode, Mechanism)
    return cls(config)


class ServerNoise:
    """The server's noise source for central DP: OS randomness by default; a server key file
    (``key``) gives reproducible runs. Never derived from the run config or anything sent to
    clients (the seed would let any client regenerate and subtract the noise).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ServerNoise:
        data = json.loads(Path(path).read_text())
        return cls(bytes.fromhex(data["server"] if "server" in data else data["master"]))

    def draw(self, dim: int, std: float, server_round: int, nonce: str = "") -> np.ndarray:
        if self._key is None:
            seed = secrets.randbits(128)
        else:
            tag = f"nonce={nonce};round={int(server_round)};purpose=central".encode()
            seed = int.from_bytes(hmac.new(self._key, tag, hashlib.sha256).digest()[:16], "little")
        return std * np.random.Generator(np.random.PCG64(seed)).standard_normal(dim)


#: The Rényi orders of Opacus' RDP accountant (``RDPAccountant.DEFAULT_ALPHAS``).
RDP_ORDERS: tuple[float, ...] = (*(1 + x / 10.0 for x in range(1, 100)), *range(12, 64))


def gaussian_epsilon(multipliers: Iterable[float], delta: float) -> float:
    """ε at ``delta`` of Gaussian mechanisms at sample rate 1 with noise multipliers
    ``multipliers``, composed: Rényi DP ``alpha / (2 sigma^2)`` each (Mironov, "Renyi
    Differential Privacy", CSF 2017), converted to ``(ε, δ)`` at :data:`RDP_ORDERS` as Opacus'
    RDP accountant does (Balle et al., "Hypothesis Testing Interpretations and Renyi
    Differential Privacy", AISTATS 2020, Thm. 21). The same ε as :class:`PrivacyAccountant`
    with ``accountant="rdp"`` and these steps (a test checks), in numpy alone: no torch import
    (a client mod computes it for every release). ``inf`` if a multiplier is 0."""
    sigmas = [float(s) for s in multipliers]
    if not sigmas:
        return 0.0
    if min(sigmas) <= 0:
        return math.inf
    orders = np.array(RDP_ORDERS)
    rdp = orders * sum(1.0 / (2.0 * s * s) for s in sigmas)
    eps = rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    return float(np.nanmin(eps))


#: The reply metrics in which an app doing DP-SGD itself (``dp='sample'``) reports, per
#: partition, the sample rate ``q`` and the number of noisy steps of its release, so that a
#: node's release ledger can account it (node config ``dp-max-epsilon``).
SAMPLE_RATE_METRIC = "dp-sample-rate"
STEPS_METRIC = "dp-steps"


def sgm_epsilon(history: Iterable[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of Sampled Gaussian Mechanisms ``(noise_multiplier, sample_rate,
    steps)``, composed as Opacus' RDP accountant composes its ``history`` (Mironov, Talwar,
    Zhang, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019): at sample
    rate 1 in numpy alone (:func:`gaussian_epsilon`), otherwise with Opacus' RDP analysis.
    ``inf`` if a mechanism with steps has a noise multiplier of 0."""
    steps = [(float(s), float(q), int(k)) for s, q, k in history if int(k) > 0]
    if any(s <= 0 for s, _, _ in steps):
        return math.inf
    if all(q == 1.0 for _, q, _ in steps):
        # k Gaussian mechanisms at noise s compose (in RDP, alpha k / 2 s^2) as one at
        # s / sqrt(k): no list of k entries (an app reporting 1e9 steps is one entry)
        return gaussian_epsilon([s / math.sqrt(k) for s, _, k in steps], delta)
    from opacus.accountants.analysis import rdp

    total = sum(rdp.compute_rdp(q=q, noise_multiplier=s, steps=k, orders=list(RDP_ORDERS))
                for s, q, k in steps)
    eps, _ = rdp.get_privacy_spent(orders=list(RDP_ORDERS), rdp=total, delta=delta)
    return float(eps)


class PrivacyAccountant:
    """ε bookkeeping with Opacus' accountants; one ``step`` per round.

    Args:
        config: the DP parameters.
        steps: the Sampled Gaussian Mechanism steps one round costs, as ``(noise_multiplier,
            sample_rate, count)`` triples (``[(sigma, 1.0, 1)]`` for partition-level DP), or a
            list of such lists, one per privacy unit (e.g. per partition for record-level DP,
            whose sample rates differ); ε is then the worst unit's.
    """

    def __init__(self, config: DPConfig, steps: list) -> None:
        self.config = config
        if steps and isinstance(steps[0], tuple):
            steps = [steps]
        self.units: list[list[tuple[float, float, int]]] = [list(u) for u in steps]
        if not self.units or not all(self.units):
            raise ValueError("the accountant needs at least one (sigma, q, count) step")
        self.rounds = 0
        # per stepped round: the noise multiplier it was accounted at (None: each step's own)
        self.multipliers: list[float | None] = []
        self._cache: dict[tuple, float] = {}

    def _make(self):
        from opacus.accountants import PRVAccountant, RDPAccountant

        return RDPAccountant() if self.config.accountant == "rdp" else PRVAccountant()

    def epsilon_after(self, rounds: int, noise_multiplier: float | None = None) -> float:
        """ε after ``rounds`` rounds at ``delta`` (0 for 0 rounds), worst privacy unit: the
        rounds already stepped at the multipliers they were stepped with, any further ones at
        ``noise_multiplier`` (``None``: each step's own)."""
        if rounds <= 0:
            return 0.0
        stepped = self.multipliers[:rounds]
        plan = [*stepped, *([noise_multiplier] * (rounds - len(stepped)))]
        counts: dict[float | None, int] = {}
        for sigma in plan:
            counts[sigma] = counts.get(sigma, 0) + 1
        key = tuple(sorted(counts.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0.0)))
        if key not in self._cache:
            units = {tuple(u) for u in self.units}
            self._cache[key] = max(self._unit_epsilon(u, counts) for u in units)
        return self._cache[key]

    def _unit_epsilon(self, unit: tuple[tuple[float, float, int], ...],
                      counts: dict[float | None, int]) -> float:
        history = []
        for sigma_round, rounds in counts.items():
            for sigma, q, count in unit:
                history.append((sigma if sigma_round is None else sigma_round, q, count * rounds))
        if any(sigma <= 0 for sigma, _, _ in history):
            return math.inf
        acc = self._make()
        # Both accountants keep a run-length history [(sigma, q, steps)] and compose it
        # order-independently; this equals calling acc.step() once per mechanism step.
        acc.history = history
        return float(acc.get_epsilon(delta=self.config.delta))

    @property
    def epsilon(self) -> float:
        return self.epsilon_after(self.rounds)

    def can_run_round(self, noise_multiplier: float | None = None) -> bool:
        """Whether one more round at ``noise_multiplier`` keeps ε within ``target_epsilon``
        (always, without a target). ``None``: the smallest multiplier stepped so far, or each
        step's own if smaller or if no round set one (a round whose multiplier depends on its
        code, e.g. ``dp-noise=independent`` with ``s="auto"``, is judged at the worst seen)."""
        target = self.config.target_epsilon
        if target <= 0:
            return True
        if noise_multiplier is None:
            seen = [m for m in self.multipliers if m is not None]
            nominal = min(sigma for unit in self.units for sigma, _, _ in unit)
            if seen and min(seen) < nominal:
                noise_multiplier = min(seen)
        return self.epsilon_after(self.rounds + 1, noise_multiplier) <= target

    def step(self, noise_multiplier: float | None = None) -> float:
        """Account one round; ``noise_multiplier``: the round's effective multiplier, replacing
        each step's own (e.g. per round when the code, and with it the effective multiplier of
        independent noise, changes from round to round). Returns ε so far."""
        if noise_multiplier is not None and not (
            isinstance(noise_multiplier, (int, float)) and not isinstance(noise_multiplier, bool)
            and noise_multiplier >= 0 and math.isfinite(noise_multiplier)
        ):
            raise ValueError(f"noise_multiplier={noise_multiplier!r} must be a finite number "
                             ">= 0 (or None: each step's own)")
        self.multipliers.append(None if noise_multiplier is None else float(noise_multiplier))
        self.rounds += 1
        return self.epsilon


def _main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="fl-gradcode DP key files")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("keygen", help="write a fresh key file (mode 0600)")
    gen.add_argument("path")
    gen.add_argument("--partitions", default="", help="comma list: per-partition keys instead")
    args = parser.parse_args(argv)
    parts = [int(x) for x in args.partitions.split(",") if x] or None
    print(write_key_file(args.path, parts))


if __name__ == "__main__":
    _main()
