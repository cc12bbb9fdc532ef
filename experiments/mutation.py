"""Mutation testing of the codes, the Flower layer, privacy, latency and adaptive coding (mutmut 3).

Usage::

    python experiments/mutation.py [--module M ...] [--max-mutants N] [--seed S]
                                   [--max-children C] [--deselect TEST_ID ...]

``M`` is a module of the test map ``tests/mutation_map.toml`` (``codes``, ``privacy``,
``wrapper``, ``adaptive``, ...; default: all). Each module is mutated by mutmut
against the FAST test files the map names for it (``-m "not simulation and not deployment"``);
mutmut runs, per mutant, only the tests that executed the mutated function.

mutmut writes a ``mutants/`` tree into the directory it runs in, so the run happens in a scratch
copy of the project (``--workdir``, default a temporary directory): the working tree is never
touched. Each module gets its own copy, ``only_mutate`` and test selection.

``--max-mutants N`` tests a fixed-seed random sample of N mutants per module (the JSON then says
``"sampled": true`` and gives the ``population``). Results go to ``results/mutation.json``::

    {"<module>": {"killed": k, "total": t, "sampled": bool, "population": P,
                  "survived": [{"mutant": name, "diff": "...", "reason": "..."}], ...}, ...}

``killed`` counts mutmut's "killed" and "timeout" verdicts; ``total`` counts every tested
mutant (survivors, mutants no selected test executes, suspicious ones). The ``reason`` of each
survivor is taken from ``REASONS`` below (maintained by hand after reading the diff: an
equivalent mutant, or the test that now kills it); unexplained survivors say so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST = ["-m", "not simulation and not deployment", "-p", "no:cacheprovider", "-p", "no:randomly",
        "-W", "ignore::DeprecationWarning", "-x", "-q"]
TEST_MAP = ROOT / "tests" / "mutation_map.toml"


def load_test_map(path: Path = TEST_MAP) -> dict[str, tuple[list[str], list[str]]]:
    """module -> (files mutated, its fast test files), from the one test map (``path``)."""
    table = tomllib.loads(path.read_text())
    return {module: (list(entry["mutate"]), list(entry["tests"]))
            for module, entry in table.items()}


# one mutmut run (scratch copy) per module
MODULES: dict[str, tuple[list[str], list[str]]] = load_test_map()
KILLED = {"killed", "timeout"}

_NAN_EQUIVALENT = (
    "equivalent: _jsonable replaces every non-finite float (numpy scalars and arrays "
    "included) by None first, so json.dumps never meets a NaN whatever allow_nan says")
_UTF8_EQUIVALENT = ("equivalent: str.encode's default encoding is UTF-8 (and codec names are "
                    "case-blind)")

_DEMO_K_EQUALS_N = ("equivalent: every scheme the demo runs (uncoded, ignore-stragglers, frc, "
                    "grouped-rs, bgc) has k = n partitions, so the branch for k != n is never "
                    "taken")

_REPORTS_STRICT = ("equivalent: strict=True only guards lengths equal by construction (the "
                   "lines before refuse sizes of another length than the worker's partitions, "
                   "one encoding coefficient each)")

# Hand-written verdicts on survivors (mutmut name -> one line). Filled in after reading diffs.
REASONS: dict[str, str] = {
    "fl_gradcode.flower.integrity.xǁProbeǁ__init____mutmut_22":
        "equivalent: np.prod(()) is 1, the value the guarded branch returns for a scalar",
    "fl_gradcode.flower.integrity.xǁProbeǁ_project__mutmut_3":
        "equivalent: astype(None) converts to float64, the dtype it names",
    "fl_gradcode.flower.integrity.x__verify_block__mutmut_11":
        "equivalent: verify_replies reports any block verdict that is neither 'verified' nor "
        "'contradicted' as 'unverified', so the block's own spelling is never seen (an earlier "
        "note claimed a test kills it; the rerun showed it does not)",
    "fl_gradcode.flower.integrity.x_verify_replies__mutmut_31":
        "killed since by test_replies_that_do_not_decode_their_block_or_no_replies_are_unverified",
    "fl_gradcode.flower.clock.xǁWallClockǁ__init____mutmut_6":
        "equivalent: WallClock.round_start is overwritten by start_round() before any read",
    "fl_gradcode.flower.protocol.x_parse_instruction__mutmut_178":
        "equivalent: the default is only read when the key is absent, and then the guard "
        "len(rec.get(key, [0.0])) > 1 is False before the generator is evaluated",
    "fl_gradcode.flower.mod.x__coded_reply__mutmut_95":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension "
        "(reshape(-2) == reshape(-1), numpy 2.4)",
    "fl_gradcode.flower.mod.x__run_partition__mutmut_58":
        "killed by tests/flower/test_mod_torch_import.py (checked by hand): it needs an "
        "interpreter without torch, so it runs the mod in a subprocess, which mutmut's "
        "per-test function map does not see",
    "fl_gradcode.flower.wrapper.x_error_amplification__mutmut_60":
        "equivalent: decoding coefficients are a float64 array already",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_decode_and_apply__mutmut_77":
        "equivalent: np.dtype(None) is float64, the dtype it names",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_record__mutmut_20":
        "equivalent: every caller of _record passes late_dropped, so the default is never read",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_decode_and_apply__mutmut_62":
        "killed since by test_keyed_central_noise_is_drawn_for_the_round_and_the_run_nonce",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_describe__mutmut_10":
        "killed since by test_config_json_of_an_auto_run_names_the_nested_adaptive_code_and_s_auto",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_describe__mutmut_16":
        "killed since by test_config_json_of_an_auto_run_names_the_nested_adaptive_code_and_s_auto",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_metrics__mutmut_39":
        "killed since by test_round_metrics_carry_the_decode_error",
    "fl_gradcode.flower.grid.x__is_coded_train__mutmut_5":
        "killed since by test_messages_other_than_coded_train_pass_straight_to_the_inner_grid",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_queued__mutmut_6":
        "equivalent: only s='auto' ever sets _decision, so 'adaptive or decision' equals "
        "'adaptive and decision' whenever it is evaluated",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_record__mutmut_21":
        "equivalent: every caller of _record passes late_dropped, so the default is never read",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁconfigure_train__mutmut_1":
        "not killed: _round = '' only matters after a round that sent nothing (exhausted DP "
        "budget or empty cohort) followed by a deadline query; no test builds one",
    "fl_gradcode.flower.wrapper.xǁGradientCodingǁ_decode_chunked__mutmut_86":
        "not killed: the warning of a non-finite communication-efficient decode (wallclock, "
        "NaN found only at decoding) loses its round argument; no test reads that log line",
    "fl_gradcode.codes.base.xǁ_LRUǁput__mutmut_4":
        "equivalent: popitem(last=None) pops the oldest item, as last=False does",
    "fl_gradcode.codes.nested.x_reflected_misses__mutmut_97":
        "equivalent: counts is m x m with m >= 1, never empty, so initial is never used",
    "fl_gradcode.privacy.xǁServerNoiseǁdraw__mutmut_5":
        "equivalent: a 129-bit instead of 128-bit OS-random seed; the noise is N(0, std^2) "
        "either way and no run can observe which seed was drawn",
    "fl_gradcode.adaptive.x__fit_gpd__mutmut_135":
        "killed since by test_the_gpd_fit_recovers_the_shape_and_scale_of_gpd_excesses",
    "fl_gradcode.adaptive.x_choose_s__mutmut_262":
        "killed since by test_the_approximate_choice_is_the_fastest_per_full_data_equivalent_"
        "not_the_smallest_r",
    "fl_gradcode.adaptive.x_decode_rule__mutmut_6":
        "equivalent: np.dtype(None) is float64, the dtype it names",
    "fl_gradcode.adaptive.xǁLatencyEstimatorǁ_estimate_beta__mutmut_33":
        "equivalent: the slope sums w * xc * yc with xc centred by the weighted mean, so "
        "sum(w * xc) = 0 and any constant subtracted from y cancels",
    "fl_gradcode.adaptive.xǁLatencyEstimatorǁ_slowness_map__mutmut_83":
        "equivalent: gpd=None is falsy, the exponential tail gpd=False selects",
    "fl_gradcode.adaptive.xǁLatencyEstimatorǁ_slowness_map__mutmut_89":
        "not killed: the exponential tail inside the slowness pass is a speed choice (no GPD "
        "fit per pass); a GPD tail changes the slowness only of clients censored beyond the "
        "last event, by amounts no test pins",
    "fl_gradcode.adaptive.xǁLatencyEstimatorǁsample_remaining__mutmut_28":
        "killed since by test_a_client_without_outstanding_work_draws_nothing_and_changes_"
        "no_other_draw",
    "fl_gradcode.adaptive.xǁLatencyEstimatorǁupdate__mutmut_35":
        "killed since by test_update_names_a_loads_vector_of_the_wrong_shape",
    "fl_gradcode.adaptive.xǁ_Survivalǁ__init____mutmut_4":
        "killed since by test_kaplan_meier_counts_a_time_censored_at_an_event_time_as_still_"
        "at_risk",
    "fl_gradcode.latency.x_expected_round_time__mutmut_2":
        "equivalent in what a test can require: the default Monte Carlo size of models "
        "without a closed form (20,000 or 20,001 rounds: both estimates are correct)",
    "fl_gradcode.flower.options.xǁAdaptiveOptionsǁ__post_init____mutmut_16":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁAdaptiveOptionsǁ__post_init____mutmut_29":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁDeadlineOptionsǁ__post_init____mutmut_11":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_21":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_38":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_39":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_6":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_7":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁdescribe__mutmut_9":
        "killed since by test_config_json_names_every_option_that_shapes_the_rounds",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_117":
        "killed since by test_a_stop_late_work_that_is_not_a_bool_is_refused_even_"
        "without_auto_deadline",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_178":
        "killed since by test_every_keyword_reaches_its_group",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_180":
        "killed since by test_every_keyword_reaches_its_group",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_63":
        "killed since by test_auto_deadline_between_1_and_2_is_refused_under_wallclock",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_96":
        "killed since by test_every_keyword_reaches_its_group",
    "fl_gradcode.flower.options.xǁTimingOptionsǁ__post_init____mutmut_10":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁTimingOptionsǁ__post_init____mutmut_20":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁTimingOptionsǁ__post_init____mutmut_33":
        "killed since by test_a_group_names_its_bad_value_in_full",
    "fl_gradcode.flower.options.xǁTimingOptionsǁ__post_init____mutmut_36":
        "killed since by test_every_keyword_reaches_its_group",
    "fl_gradcode.flower.options.xǁTimingOptionsǁ__post_init____mutmut_41":
        "killed since by test_every_keyword_reaches_its_group",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_122":
        "equivalent: _code_options never reads its s argument (s_max and m are the "
        "keywords it merges)",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁ_parse__mutmut_22":
        "killed since by test_a_reply_in_another_dtype_than_the_rounds_wire_is_"
        "rejected",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁ_parse__mutmut_28":
        "killed since by test_a_reply_in_another_dtype_than_the_rounds_wire_is_"
        "rejected",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁ_parse__mutmut_8":
        "killed since by test_a_reply_from_a_member_sent_nothing_is_rejected_wi"
        "th_its_worker",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁcross_check__mutmut_16":
        "killed since by test_an_outvoted_replica_is_excluded_and_named_in_the_"
        "log",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_late_reply__mutmut_14":
        "killed since by test_the_collectors_log_lines_name_the_node_and_the_ro"
        "und",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_late_reply__mutmut_9":
        "killed since by test_the_collectors_log_lines_name_the_node_and_the_ro"
        "und",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_reply__mutmut_18":
        "killed since by test_an_error_reply_with_a_foreign_sender_is_the_failu"
        "re_of_the_node_it_answers",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_reply__mutmut_35":
        "killed since by test_an_error_reply_with_a_foreign_sender_is_the_failu"
        "re_of_the_node_it_answers",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_reply__mutmut_54":
        "killed since by test_a_reply_from_a_member_sent_nothing_is_rejected_wi"
        "th_its_worker",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁon_unsent__mutmut_13":
        "killed since by test_the_collectors_log_lines_name_the_node_and_the_ro"
        "und",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁready__mutmut_19":
        "killed since by test_under_verify_a_decodable_round_returns_early_only"
        "_once_cross_checked",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁverdict__mutmut_10":
        "killed since by test_the_cross_check_measures_disagreement_against_the"
        "_replies_exact_sizes",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁwithholds__mutmut_34":
        "killed since by test_withholding_says_why_in_the_log",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁwithholds__mutmut_38":
        "killed since by test_withholding_says_why_in_the_log",
    "fl_gradcode.flower.deadline_policy.xǁDeadlinePolicyǁround_deadline__mutmut_8":
        "killed since by test_a_prediction_of_zero_seconds_keeps_the_straggler_"
        "deadline",
    "fl_gradcode.flower.dispatch.xǁDispatcherǁmessage__mutmut_64":
        "killed since by test_the_weight_key_defaults_to_num_examples_for_a_str"
        "ategy_without_one",
    "fl_gradcode.flower.opener.xǁRoundOpenerǁopen__mutmut_50":
        "killed since by test_a_member_the_policy_excludes_is_sent_nothing_and_"
        "recorded_as_excluded_not_busy",
    "fl_gradcode.flower.opener.xǁRoundOpenerǁplan__mutmut_49":
        "killed since by test_a_member_the_policy_excludes_is_sent_nothing_and_"
        "recorded_as_excluded_not_busy",
    "fl_gradcode.flower.round_state.xǁRoundStateǁreject__mutmut_10":
        "killed since by test_the_collectors_log_lines_name_the_node_and_the_ro"
        "und",
    "fl_gradcode.flower.workload.xǁWorkloadǁpartitions__mutmut_10":
        "killed since by test_a_code_with_fewer_partitions_than_clients_splits_"
        "the_apps_data_and_says_so_once",
    "fl_gradcode.flower.workload.xǁWorkloadǁpartitions__mutmut_12":
        "killed since by test_a_code_with_fewer_partitions_than_clients_splits_"
        "the_apps_data_and_says_so_once",
    "fl_gradcode.flower.workload.xǁWorkloadǁpartitions__mutmut_6":
        "killed since by test_a_code_with_fewer_partitions_than_clients_splits_"
        "the_apps_data_and_says_so_once",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁprobe_for__mutmut_6":
        "equivalent: round_probe hands verify_refusal a GradientCode, whose branch never "
        "reads the options (they matter only for a registry name)",
    "fl_gradcode.flower.aggregator.xǁRoundAggregatorǁdecode__mutmut_38":
        "killed since by "
        "test_a_nan_in_a_reply_the_decoding_does_not_read_rejects_nothing",
    "fl_gradcode.flower.aggregator.xǁRoundAggregatorǁdecode__mutmut_47":
        "killed since by test_a_reply_whose_nan_spoils_the_decoded_model_is_rejected_an"
        "d_the_round_decoded_again",
    "fl_gradcode.flower.aggregator.xǁRoundAggregatorǁdecode__mutmut_61":
        "killed since by test_a_reply_whose_nan_spoils_the_decoded_model_is_rejected_an"
        "d_the_round_decoded_again",
    "fl_gradcode.flower.aggregator.xǁRoundAggregatorǁdecode__mutmut_75":
        "killed since by test_a_reply_whose_nan_spoils_the_decoded_model_is_rejected_an"
        "d_the_round_decoded_again",
    "fl_gradcode.flower.decoder.x_error_amplification__mutmut_31":
        "killed since by "
        "test_error_amplification_is_the_worst_decodable_set_and_reproducible",
    "fl_gradcode.flower.decoder.x_error_amplification__mutmut_4":
        "killed since by "
        "test_error_amplification_is_the_worst_decodable_set_and_reproducible",
    "fl_gradcode.flower.decoder.x_error_amplification__mutmut_49":
        "killed since by test_auto_wire_sends_float64_for_a_code_that_amplifies_roundin"
        "g_beyond_the_limit",
    "fl_gradcode.flower.decoder.xǁDecoderǁapply__mutmut_52":
        "killed since by "
        "test_a_non_finite_inner_model_is_named_with_its_round_in_the_log",
    "fl_gradcode.flower.decoder.xǁDecoderǁapply__mutmut_55":
        "killed since by "
        "test_a_non_finite_inner_model_is_named_with_its_round_in_the_log",
    "fl_gradcode.flower.decoder.xǁDecoderǁwire_for__mutmut_11":
        "killed since by test_auto_wire_sends_float64_for_a_code_that_amplifies_roundin"
        "g_beyond_the_limit",
    "fl_gradcode.flower.decoder.x_combine__mutmut_24":
        "equivalent: the scratch buffer only differs when the accumulator is float32, "
        "and then the replies are float32: numpy picks the float32 loop from the "
        "inputs, so the product is the same, and adding its float64 copy to a float32 "
        "block rounds once, as float32 addition does",
    "fl_gradcode.flower.decoder.x_error_amplification__mutmut_19":
        "not killed: dropping the all-replies set changes nothing for any registry code"
        " measured (its amplification is below the sampled subsets' for crc, "
        "grouped-rs, nested, comm-efficient, bgc); no test pins a code where it is the "
        "maximum",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_154":
        "equivalent: at exactly 2**20 values the arrays are finished serially instead "
        "of on a thread pool; each array's result is the same either way",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_18":
        "not killed: the fallback runs only for a decoding whose chunk rows read no "
        "reply (all coefficients zero); no code gives one for a non-empty set, so no "
        "test reaches it",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_198":
        "equivalent: strict=True only guards lengths equal by construction (one "
        "decoding row entry per used reply, one chosen reply per used reply)",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_215":
        "equivalent: strict=True only guards lengths equal by construction (one result "
        "per layout name)",
    "fl_gradcode.flower.decoder.xǁReplyLayoutǁmessage__mutmut_7":
        "equivalent: num_examples is a Python float (the protocol parses it with "
        "float()), so np.array infers float64, the dtype it names",
    "fl_gradcode.flower.decoder.xǁReplyLayoutǁmessage__mutmut_9":
        "equivalent: num_examples is a Python float (the protocol parses it with "
        "float()), so np.array infers float64, the dtype it names",
    "fl_gradcode.flower.privatiser.xǁPrivatiserǁnoise_multiplier__mutmut_15":
        "equivalent: a code's B is a float64 array already (GradientCode stores "
        "np.array(B, dtype=float64))",
    "fl_gradcode.matmul.x__check_matrix__mutmut_24":
        "equivalent: astype(None) converts to float64, the dtype it names",
    "fl_gradcode.matmul.x__worker_subsets__mutmut_11":
        "equivalent: Generator.choice treats replace=None as false: the same draws as "
        "replace=False (checked for 20 draws from one seed)",
    "fl_gradcode.matmul.x__screened__mutmut_19":
        "equivalent: '<=' keeps a later draw only when its worst condition number ties the "
        "best so far exactly, which Gaussian draws do with probability zero",
    "fl_gradcode.matmul.xǁ_CodedJobǁ_check_results__mutmut_21":
        "equivalent: strict=True only guards lengths equal by construction (one array per "
        "worker)",
    "fl_gradcode.matmul.xǁ_CodedJobǁ_solve__mutmut_7":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension",
    "fl_gradcode.matmul.x_coded_least_squares_gradient__mutmut_35":
        "equivalent: the backward job's generator is seeded seed + 2 instead of seed + 1: "
        "another screened Gaussian generator, equally exact and reproducible; no contract "
        "names the seed offset",
    "fl_gradcode.results.xǁRoundRecorderǁ__init____mutmut_25": _NAN_EQUIVALENT,
    "fl_gradcode.results.xǁRoundRecorderǁ__init____mutmut_33": _NAN_EQUIVALENT,
    "fl_gradcode.results.xǁRoundRecorderǁrecord__mutmut_8": _NAN_EQUIVALENT,
    "fl_gradcode.results.xǁRoundRecorderǁrecord__mutmut_14": _NAN_EQUIVALENT,
    "fl_gradcode.results.xǁRoundRecorderǁdebug__mutmut_11": _UTF8_EQUIVALENT,
    "fl_gradcode.results.xǁRoundRecorderǁdebug__mutmut_14": _UTF8_EQUIVALENT,
    "fl_gradcode.demo.x_main__mutmut_41":
        "equivalent: argparse keeps an option's string as it is when type is None, as str does",
    "fl_gradcode.demo.x_run__mutmut_111":
        "equivalent: parts is np.array_split(order, n), so splitting into code.k = n parts "
        "again gives the same partitions",
    "fl_gradcode.demo.x_run__mutmut_114": _DEMO_K_EQUALS_N,
    "fl_gradcode.demo.x_run__mutmut_115": _DEMO_K_EQUALS_N,
    "fl_gradcode.demo.x_run__mutmut_116": _DEMO_K_EQUALS_N,
    "fl_gradcode.demo.x_run__mutmut_131":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension",
    "fl_gradcode.demo.x_run__mutmut_175":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension",
    "fl_gradcode.flower.client_policy.x__file_claim__mutmut_40":
        "equivalent: the entry is built as node, nonce, round: already the sorted key order",
    "fl_gradcode.flower.client_policy.xǁNodePolicyǁfrom_node_config__mutmut_5":
        "equivalent: an absent dp-required read as None is mapped to 'none' by the next line",
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_31": _REPORTS_STRICT,
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_32": _REPORTS_STRICT,
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_44":
        "equivalent: the sizes are multiplied by float64 coefficients, so the product is "
        "float64 whatever dtype numpy infers for the sizes",
    "fl_gradcode.flower.x___getattr____mutmut_1":
        "killed in effect, not by mutmut's verdict: with 'name in _LAZY' every lookup of a "
        "name the package lacks (pytest asks for __wrapped__) raises KeyError, so pytest "
        "cannot collect the tests (exit code 2, which mutmut reports as 'interrupted'); "
        "checked by applying it alone",
    "fl_gradcode.flower.membership.x__short__mutmut_5":
        "not killed: every handshake reason the tests produce is over 300 characters once "
        "explain_error_reply has added its advice, so no test shows a short reason left uncut",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_108":
        "equivalent: _code_options never reads its s argument (s_max and m are the "
        "keywords it merges)",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_19":
        "equivalent: for a code object exact=True puts grouped-rs (it builds for every s < n) "
        "before the smaller-s candidates, the only ones that read the options",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_53":
        "equivalent: crc builds for every s < n (checked for n <= 7), so a crc spec never "
        "reaches the fallback whose exactness the name decides",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_61":
        "equivalent: with tried_spec falsy the spec is tried again with the same s, fails "
        "with the same ValueError and is skipped",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_70":
        "equivalent: with tried_spec=False the spec is tried again with the same s, fails "
        "with the same ValueError and is skipped",
}


def _mutmut_section(only_mutate: list[str], tests: list[str], extra: list[str]) -> str:
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return (
        "[tool.mutmut]\n"
        'source_paths = ["fl_gradcode"]\n'
        f"only_mutate = {q(only_mutate)}\n"
        'also_copy = ["server", "clients", "examples", "experiments", "docs"]\n'
        f"pytest_add_cli_args_test_selection = {q(tests)}\n"
        f"pytest_add_cli_args = {q(FAST + extra)}\n"
        "use_git_change_detection = false\n"
        # fork each mutant from a server that only collected the tests, never from the
        # process that ran them (torch's thread pools make a forked worker deadlock, which
        # mutmut would then report as a "timeout", i.e. killed)
        'process_isolation = "forkserver"\n'
    )


def prepare(workdir: Path, group: str, modules: list[str], extra: list[str]) -> Path:
    """A scratch copy of the project whose ``[tool.mutmut]`` mutates ``modules`` only."""
    dst = workdir / group
    if dst.exists():
        shutil.rmtree(dst)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results", "mutants", ".git",
                                    "*.png", "*.npz", ".flwr")
    for name in ("fl_gradcode", "tests", "server", "clients", "examples", "experiments", "docs"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    (dst / "results").mkdir()
    globs = [g for m in modules for g in MODULES[m][0]]
    text = (dst / "pyproject.toml").read_text()
    tests = list(dict.fromkeys(t for m in modules for t in MODULES[m][1]))
    section = _mutmut_section(globs, tests, extra)
    if "[tool.mutmut]" in text:
        text = re.sub(r"\[tool\.mutmut\]\n(?:(?!\[).*\n)*", section + "\n", text)
    else:
        text += "\n" + section
    (dst / "pyproject.toml").write_text(text)
    return dst


def mutmut(cwd: Path, *names: str, log: Path, max_children: int = 1) -> int:
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "a") as out:
        return subprocess.call(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)


def load_meta(cwd: Path) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in (cwd / "mutants").rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def module_of(name: str) -> str | None:
    """The module whose mutated files hold mutant ``name`` (the longest matching prefix)."""
    best, length = None, -1
    for module, (globs, _) in MODULES.items():
        for g in globs:
            prefix = g.removesuffix(".py").removesuffix("/*").removesuffix("/__init__")
            prefix = prefix.replace("/", ".")
            if name.startswith(prefix + ".") and len(prefix) > length:
                best, length = module, len(prefix)
    return best


def diff_of(cwd: Path, name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=cwd,
                         capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines()
             if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return " | ".join(ln.strip() for ln in lines)[:300]


def run_group(group: str, modules: list[str], args: argparse.Namespace) -> dict:
    from mutmut.stats import status_by_exit_code

    extra = [f"--deselect={t}" for t in args.deselect]
    cwd = prepare(args.workdir, group, modules, extra)
    log = args.workdir / f"{group}.log"
    # 1. generate every mutant and collect test<->function stats (nothing is run yet: the
    #    filter matches no mutant, mutmut stops after the stats run)
    mutmut(cwd, "__generate_only__", log=log, max_children=args.max_children)
    population = {name: module_of(name) for name in load_meta(cwd)}
    if not population:
        raise SystemExit(f"mutmut generated no mutants for {group}; see {log}")
    chosen: dict[str, list[str]] = {}
    rng = random.Random(args.seed)
    for module in modules:
        names = sorted(n for n, m in population.items() if m == module)
        if args.max_mutants and len(names) > max(args.max_mutants, args.full_up_to):
            names = sorted(rng.sample(names, args.max_mutants))
        chosen[module] = names
    # 2. run the chosen mutants (explicit names: mutmut tests exactly these)
    todo = [n for names in chosen.values() for n in names]
    for start in range(0, len(todo), 200):  # keep the command line short
        mutmut(cwd, *todo[start : start + 200], log=log, max_children=args.max_children)
    codes = load_meta(cwd)
    if all(codes.get(n) is None for n in todo):
        raise SystemExit(f"mutmut tested no mutant of {group} (stats or clean run failed?); "
                         f"see {log}")
    out = {}
    for module in modules:
        names = chosen[module]
        status = {n: status_by_exit_code[codes.get(n)] for n in names}
        survivors = [n for n, s in status.items() if s not in KILLED]
        total_pop = sum(1 for m in population.values() if m == module)
        out[module] = {
            "killed": sum(s in KILLED for s in status.values()),
            "total": len(names),
            "sampled": len(names) < total_pop,
            "population": total_pop,
            "by_status": {s: list(status.values()).count(s) for s in sorted(set(status.values()))},
            "timeouts": sorted(n for n, s in status.items() if s == "timeout"),
            "survived": [
                {"mutant": n, "status": status[n], "diff": diff_of(cwd, n),
                 "reason": REASONS.get(n, "unexplained: not reviewed yet")}
                for n in survivors
            ],
        }
    return out


def tests_of(cwd: Path, name: str) -> list[str]:
    """The test ids mutmut runs for mutant ``name`` (those that executed its function)."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "tests-for-mutant", name], cwd=cwd,
                         capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines() if "::" in ln]


def alone(cwd: Path, name: str, wall_s: float = 120.0) -> str:
    """Apply mutant ``name`` alone to the scratch copy's source, run its tests without mutmut's
    CPU limit, restore the source. 'killed' (a test fails), 'survived' (all pass), 'timeout'
    (still running after ``wall_s`` seconds: a real hang, which counts as killed)."""
    tests = tests_of(cwd, name)
    if not tests:
        return "no tests"
    src = cwd / "fl_gradcode"
    backup = cwd / "_pristine_fl_gradcode"
    shutil.copytree(src, backup)
    try:
        subprocess.run([sys.executable, "-m", "mutmut", "apply", name], cwd=cwd, check=True,
                       capture_output=True)
        env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", *FAST, *tests], cwd=cwd, env=env,
                                capture_output=True, timeout=wall_s).returncode
        except subprocess.TimeoutExpired:
            return "timeout"
        return "survived" if rc == 0 else "killed"
    finally:
        shutil.rmtree(src)
        backup.rename(src)


def recheck(module: str, entry: dict, args: argparse.Namespace) -> dict:
    """Re-run, in a fresh scratch copy (new tests collected, stats gathered anew), only the
    mutants ``entry`` lists as survivors, and confirm each timeout verdict by running the
    mutant alone (a timeout on a loaded machine is not a kill); returns the updated entry."""
    from mutmut.stats import status_by_exit_code

    t0 = time.monotonic()
    extra = [f"--deselect={t}" for t in args.deselect]
    cwd = prepare(args.workdir, module, [module], extra)
    log = args.workdir / f"{module}.recheck.log"
    mutmut(cwd, "__generate_only__", log=log, max_children=args.max_children)
    population = load_meta(cwd)
    old = {s["mutant"]: s for s in entry["survived"]}
    changed = [n for n, s in old.items()
               if n not in population or diff_of(cwd, n) != s["diff"]]
    if changed:
        raise SystemExit(f"{module}: the source changed since the run; these mutants are no "
                         f"longer the ones recorded: {changed}; re-run the sample instead")
    names = sorted(old)
    if names:
        mutmut(cwd, *names, log=log, max_children=args.max_children)
    codes = load_meta(cwd)
    status = {n: status_by_exit_code[codes.get(n)] for n in names}
    # a timeout is confirmed (or not) by the mutant alone, without mutmut's CPU limit
    timeouts = sorted(set(entry.get("timeouts", [])) | {n for n, s in status.items()
                                                        if s == "timeout"})
    alone_verdicts = {n: alone(cwd, n, args.alone_timeout) for n in timeouts}
    for n, v in alone_verdicts.items():
        if v not in ("killed", "timeout"):
            status[n] = f"timeout, {v} alone"
    out = dict(entry)
    by_status = dict(entry["by_status"])
    for n, s in status.items():
        before = old[n]["status"] if n in old else "timeout"
        by_status[before] -= 1
        by_status[s] = by_status.get(s, 0) + 1
    out["by_status"] = {k: v for k, v in sorted(by_status.items()) if v}
    survivors = [n for n in sorted(set(names) | set(timeouts)) if status.get(n, "killed")
                 not in KILLED]
    out["killed"] = entry["total"] - len(survivors)
    out["survived"] = [
        {"mutant": n, "status": status[n],
         "diff": old[n]["diff"] if n in old else diff_of(cwd, n),
         "reason": REASONS.get(n, "unexplained: not reviewed yet")}
        for n in survivors
    ]
    out["rechecked"] = {
        "mutants": len(names), "killed": sum(status[n] in KILLED for n in names),
        "timeouts_confirmed_alone": alone_verdicts,
        "killed_before": entry["killed"], "runtime_s": round(time.monotonic() - t0, 1),
        "command": "python experiments/mutation.py " + " ".join(sys.argv[1:]),
    }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--module", action="append", choices=sorted(MODULES),
                   help="module to mutate (repeatable; default: all)")
    p.add_argument("--max-mutants", type=int, default=0,
                   help="sample at most N mutants per module (fixed seed); 0 = all")
    p.add_argument("--full-up-to", type=int, default=0,
                   help="run every mutant of a module whose population is at most this size "
                        "(sample --max-mutants only above it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-children", type=int, default=1,
                   help="mutmut worker processes (default 1: the machine is shared)")
    p.add_argument("--deselect", action="append", default=[],
                   help="test node id to leave out (e.g. a test broken in the working tree)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="scratch directory for the project copies (default: a temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "mutation.json")
    p.add_argument("--recheck", action="store_true",
                   help="re-run only the survivors each module's entry in --out lists (after "
                        "new tests), confirm its timeouts alone, and update its verdicts")
    p.add_argument("--alone-timeout", type=float, default=120.0,
                   help="seconds a timeout mutant's tests may run alone before the timeout "
                        "is confirmed as a hang (--recheck)")
    args = p.parse_args(argv)
    modules = args.module or list(MODULES)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fl-gradcode-mutation-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.recheck:
        for module in modules:
            if module not in result:
                raise SystemExit(f"--recheck {module}: {args.out} has no entry for it")
            result[module] = recheck(module, result[module], args)
            r = result[module]
            print(f"{module:10s} recheck: killed {r['rechecked']['killed_before']} -> "
                  f"{r['killed']}/{r['total']}")
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    for module in modules:
        mods = [module]
        t1 = time.monotonic()
        result.update(run_group(module, mods, args))
        for m in mods:  # each module keeps the settings it was last run with
            result[m]["run"] = {"seed": args.seed, "max_mutants": args.max_mutants,
                                "deselected": args.deselect,
                                "runtime_s": round(time.monotonic() - t1, 1),
                                "command": "python experiments/mutation.py "
                                           + " ".join(argv or sys.argv[1:])}
        for m in mods:
            r = result[m]
            print(f"{m:10s} killed {r['killed']}/{r['total']}"
                  + (f" (sampled from {r['population']})" if r["sampled"] else ""))
    meta = result.setdefault("_meta", {})
    import mutmut

    meta.update({"tool": f"mutmut {mutmut.__version__}", "seed": args.seed,
                 "max_mutants": args.max_mutants, "deselected": args.deselect,
                 "command": "python experiments/mutation.py " + " ".join(argv or sys.argv[1:]),
                 "last_runtime_s": round(time.monotonic() - t0, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} in {time.monotonic() - t0:.0f} s (workdir {args.workdir})")


if __name__ == "__main__":
    main()
