"""Hand-written verdicts on the survivors of tools/mutation.py (mutmut name -> one line),
filled in after reading each diff: an equivalent mutant (with why), the test that kills it
since, or why it is not killed."""

from __future__ import annotations

_NAN_EQUIVALENT = (
    "equivalent: _jsonable replaces every non-finite float (numpy scalars and arrays "
    "included) by None first, so json.dumps never meets a NaN whatever allow_nan says")
_UTF8_EQUIVALENT = ("equivalent: str.encode's default encoding is UTF-8 (and codec names are "
                    "case-blind)")

_DEMO_K_EQUALS_N = ("equivalent: every scheme the demo runs (uncoded, ignore-stragglers, frc, "
                    "grouped-rs, bgc) has k = n partitions, so the branch for k != n is never "
                    "taken")

_REPORTS_SHORTER_SUM = ("killed since by test_a_code_with_fewer_coefficients_than_partitions_"
                        "is_an_error_not_a_shorter_sum")

_CLAIMS_ORDERED = (
    "equivalent: the default of Membership._order.get/pop is never used: handshake gives "
    "every node it adds to claims an _order entry in the same call, only _forget_departed "
    "removes claims and it removes the _order entry with them (claims' keys are always "
    "_order's keys; the wrapper only reads claims)")
_MEMBERSHIP_DEPART = ("killed since by test_a_departed_nodes_released_claim_is_logged_with_the_"
                      "node_and_its_partition")
_MEMBERSHIP_HINT = ("killed since by test_the_handshake_warning_gives_the_hint_only_the_first_"
                    "time_a_node_fails")
_MEMBERSHIP_MALFORMED = ("killed since by test_a_malformed_identity_is_a_failure_with_its_own_"
                         "short_reason_and_a_bad_range_named")

_LEARNING_SYNTHETIC = "killed since by test_synthetic_dataset_is_fedprox_synthetic_alpha_beta"
_LEARNING_RUN_PARTITIONS = ("killed since by test_run_partitions_reads_dataset_seed_synthetic_"
                            "alpha_beta_and_partitioner")
_LEARNING_K = ("killed since by test_partition_indices_defaults_to_dirichlet_takes_one_"
               "partition_and_refuses_bad_k")
_LEARNING_DP_INPUTS = ("killed since by test_dp_updates_convert_inputs_to_float64_and_int64_and_"
                       "take_any_seed")
_VIEW_LOAD_DTYPE = (
    "equivalent for every real load: CohortView only writes the load into a float64 array "
    "(full_l[members] = load converts as np.asarray(load, float64) would, strings and None "
    "included) and its shape check does not depend on the dtype; only a complex load differs "
    "(numpy's TypeError against a ComplexWarning)")
_BETA_CENTRING = (
    "equivalent: the slope sums w * xc * yc with xc centred by the weighted mean, so "
    "sum(w * xc) = 0 and any constant subtracted from y (here the unweighted mean) cancels")
_PARTITION_AXIS = ("equivalent: row is 2-D (samples x members), so np.partition's default "
                   "axis=-1 is axis 1")
_KM_FACTOR_IN_0_1 = (
    "equivalent: the Kaplan-Meier factor 1 - w / max(at_risk, TINY) lies in [0, 1] for weights "
    ">= 0 (at_risk is the reverse cumulative sum of the weights, w included; float addition of "
    "non-negatives is monotone), and every weight reaching Survival is >= 0 (0.5**age round "
    "weights, prior_weight validated >= 0), so no clip bound is ever met")
_SLOWNESS_EDGE = (
    "not killed: a censored index reaches size - 1 only for the fine candidate phi = -6.5 "
    "(coarse optimum at the grid's lower end -6, a client ~400x faster than the pooled curve) "
    "of a censored log time within h/2 of the largest z; the mutant then reads the survival one "
    "cell (0.02 in log time) earlier for that single candidate, which changes the argmax only "
    "on a near tie; no test (and no realistic data) builds one")

_INTEGRITY_CACHE = ("killed since by test_an_excluded_reply_leaves_an_essential_one_unchecked_and_"
                     "the_cache_keeps_block_verdicts (the cache holds each block's own verdict)")

_EINSUM_CASE = "equivalent: einsum subscripts are letters of either case ('KJ' = 'kj')"
_PROD_EMPTY = "equivalent: np.prod(()) is 1, the value the guarded branch returns for a scalar"
_ASTYPE_NONE = "equivalent: astype(None) converts to float64, the dtype it names"
_INF_CASE = "equivalent: float() parses 'INF' case-blind: float('INF') == float('inf')"
_INTEGRITY_DIGEST = (
    "not killed: the digest size only chooses which keyed pseudo-random weights a seed gives; "
    "every documented property (secret, per metric name, uniform on [-1/2, 1/2], reproducible "
    "per seed, linear) holds for either size, so only golden values taken from the code itself "
    "could tell them apart")

_COMPAT = "fl_gradcode.flower.compat."
_COMPAT_ZIP = ("equivalent: strict only guards lengths equal by then (_same returns False on "
               "unequal lengths first; check_averaging builds one member per weight)")
_COMPAT_FRAMES = (
    "not killed on purpose: check_caller then looks at 7 frames above GradientCoding's method, "
    "not 6; that matters only for a DP wrapper with six pass-through wrappers "
    "between it and GradientCoding; a test needing that one undetected would pin a limitation, "
    "not a contract")
_COMPAT_SEEN = ("equivalent: rounds are ints; check() returns while _round is None and record() "
                "replaces _seen by {} on its first call (None != round), so None is never read")

REASONS: dict[str, str] = {
    "fl_gradcode.flower.integrity.xǁProbeǁ__init____mutmut_22": _PROD_EMPTY,
    "fl_gradcode.flower.integrity.xǁProbeǁ_project__mutmut_3": _ASTYPE_NONE,
    "fl_gradcode.flower.integrity.x__verify_block__mutmut_11": _INTEGRITY_CACHE,
    "fl_gradcode.flower.integrity.x__norm__mutmut_23": _INF_CASE,
    "fl_gradcode.flower.integrity.x_applied_disagreement__mutmut_65": _INF_CASE,
    "fl_gradcode.flower.integrity.xǁProbeǁ_dense__mutmut_66": _EINSUM_CASE,
    "fl_gradcode.flower.integrity.xǁProbeǁmeasure__mutmut_35":
        "equivalent: extra starts with a Python float, so numpy makes the list float64 for "
        "every int/float metric a MetricRecord holds (list values fail earlier, in "
        "_metric_part's float()), and _accumulate converts x to float64 itself",
    "fl_gradcode.flower.integrity.xǁProbeǁ__init____mutmut_17": _INTEGRITY_DIGEST,
    "fl_gradcode.flower.integrity.xǁProbeǁ_metric_part__mutmut_9": _INTEGRITY_DIGEST,
    "fl_gradcode.flower.integrity.x__candidates__mutmut_9":
        "killed since by test_a_large_block_confirms_only_its_candidates_whatever_its_size",
    "fl_gradcode.flower.integrity.x__candidates__mutmut_115": _EINSUM_CASE,
    "fl_gradcode.flower.integrity.x__candidates__mutmut_95":
        "killed since by test_a_large_block_confirms_only_its_candidates_whatever_its_size",
    "fl_gradcode.flower.integrity.xǁProbeǁ__init____mutmut_29": _PROD_EMPTY,
    "fl_gradcode.flower.integrity.xǁProbeǁ_dense__mutmut_24":
        "equivalent: astype's copy=None shares a float64 block as copy=False; it is only read",
    "fl_gradcode.flower.integrity.xǁProbeǁ_sampled__mutmut_2": _ASTYPE_NONE,
    "fl_gradcode.flower.integrity.x_applied_disagreement__mutmut_8":
        "killed since by test_applied_disagreement_reads_long_double_coefficients_as_float64",
    "fl_gradcode.flower.integrity.x_verify_replies__mutmut_31":
        "killed since by test_replies_that_do_not_decode_their_block_or_no_replies_are_unverified",
    "fl_gradcode.flower.clock.xǁWallClockǁ__init____mutmut_6":
        "killed since by test_a_default_clock_does_not_stop_late_work_and_starts_at_zero",
    # protocol
    "fl_gradcode.flower.protocol.x__npy_header__mutmut_2":
        "equivalent: the two differ only for len(data) == 10, and then the header slice "
        "data[10:10 + size] is empty, which the anchored header regex (it needs \"{'descr'\") "
        "cannot match, so the original returns None as well",
    "fl_gradcode.flower.protocol.x_array_view__mutmut_52":
        "equivalent: numpy reads an order string by its first letter, case-blind: "
        "reshape(order='f') is reshape(order='F') (numpy 2.4, no warning)",
    "fl_gradcode.flower.protocol.x_npy_array__mutmut_43":
        "equivalent: bytes.join copies a buffer's raw bytes whatever its format, so a "
        "memoryview cast to signed 'b' joins the same bytes as unsigned 'B'",
    "fl_gradcode.flower.protocol.x_parse_instruction__mutmut_61":
        "killed since by test_more_partitions_than_one_instruction_may_carry_are_refused_"
        "naming_the_limit",
    "fl_gradcode.flower.protocol.x_parse_reply__mutmut_14":
        "killed since by test_a_reply_in_another_dtype_than_the_rounds_wire_dtype_is_"
        "rejected_naming_both",
    "fl_gradcode.flower.protocol.xǁInstructionǁcheck_train__mutmut_6":
        "killed since by test_a_train_instruction_without_a_worker_is_refused_naming_the_worker",
    "fl_gradcode.flower.protocol.x_parse_instruction__mutmut_178":
        "equivalent: the default is only read when the key is absent, and then the guard "
        "len(rec.get(key, [0.0])) > 1 is False before the generator is evaluated",
    "fl_gradcode.flower.protocol.x__parse_train__mutmut_122":
        "killed since by test_a_parsed_reply_names_the_node_that_sent_it",
    "fl_gradcode.flower.protocol.x_array_view__mutmut_38":
        "killed since by test_bytes_after_the_array_are_ignored_as_numpys_reader_ignores_them",
    "fl_gradcode.flower.protocol.x_array_view__mutmut_6":
        "killed since by test_a_header_as_numpy_writes_it_skips_numpys_literal_eval_parser",
    "fl_gradcode.flower.protocol.x_parse_identity__mutmut_9":
        "killed since by test_an_identify_reply_without_the_record_names_the_lookup_error",
    "fl_gradcode.flower.protocol.x_parse_instruction__mutmut_176":
        "killed since by test_worker_minus_one_means_not_sent_and_below_it_is_refused",
    "fl_gradcode.flower.protocol.x_parse_instruction__mutmut_82":
        "killed since by test_a_partition_id_not_below_its_num_partitions_is_refused_naming_both",
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
        "equivalent: a 129-bit instead of 128-bit OS-random seed (no server key only); "
        "PCG64(seed) hashes an int of any width through SeedSequence into its state, and the "
        "seed is never returned, logged or stored, so the only output is N(0, std^2) noise from "
        "a seed uniform on 2^128 or 2^129 values: no run can tell them apart (only intercepting "
        "the call to secrets.randbits could, i.e. testing the code, not its behaviour)",
    "fl_gradcode.privacy.xǁPrivacyAccountantǁepsilon_after__mutmut_25":
        "equivalent: the sort only makes the cache key a canonical form of the (sigma, count) "
        "pairs; putting None last instead of first is another fixed total order of the distinct "
        "keys, so the same counts still map to one key and different counts never share one "
        "(the tuple holds every pair): every epsilon returned is the one computed for its own "
        "counts",
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
    "fl_gradcode.latency.x_expected_round_time__mutmut_49":
        "equivalent: at shape*(n-k+1) == 1 exactly, the < branch reaches gammaln(j - 1/shape) "
        "= gammaln(0) = inf, so math.exp gives the same inf; the two differ only where the "
        "float product rounds to 1.0 while the exact one exceeds 1 (e.g. shape = "
        "0.33333333333333337, n=3, k=1: 6.8e15 instead of inf), where the true mean is finite "
        "but ~1e15 and neither answer is more right than the documented <= rule",
    "fl_gradcode.latency.x_harmonic__mutmut_14":
        "equivalent: for n = 0 the sum over np.arange(1, 1) is empty, 0.0 either way, and "
        "negative n takes the else branch in both",
    "fl_gradcode.latency.x_client_delay__mutmut_32":
        "killed since by test_a_bimodal_client_delay_draws_its_time_then_its_slowness_from_"
        "the_client_stream",
    "fl_gradcode.latency.x_client_delay__mutmut_8":
        "killed since by test_a_load_scaled_trace_client_delay_is_the_csv_time_times_the_load",
    "fl_gradcode.latency.x_client_times__mutmut_10":
        "killed since by test_client_times_pass_the_load_to_a_load_scaled_model",
    "fl_gradcode.latency.x_make_latency__mutmut_1":
        "killed since by test_make_latency_defaults_and_bimodal_fraction_are_the_documented_ones",
    "fl_gradcode.latency.x_make_latency__mutmut_40":
        "killed since by test_make_latency_defaults_and_bimodal_fraction_are_the_documented_ones",
    "fl_gradcode.latency.x_round_times__mutmut_14":
        "killed since by test_uncoded_and_ignore_stragglers_rounds_compute_one_partition_per_"
        "client",
    "fl_gradcode.latency.xǁTraceReplayǁ__init____mutmut_19":
        "killed since by test_an_unknown_trace_lists_every_bundled_trace_in_full",
    "fl_gradcode.latency.xǁ_SlowFractionǁ__post_init____mutmut_12":
        "killed since by test_a_bad_slowdown_is_named_in_full",
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
    "fl_gradcode.flower.workload.xǁWorkloadǁ__init____mutmut_5": "equivalent: warned_repartition "
        "is only read as `not self.warned_repartition` (None is falsy like False)",
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
        "killed since by test_a_decoding_that_reads_no_reply_decodes_no_examples",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_198":
        "equivalent: strict=True only guards lengths equal by construction (one "
        "decoding row entry per used reply, one chosen reply per used reply)",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_197":
        "equivalent: the metrics are reached only with a positive decoded count, a sum over "
        "the used replies: with none used the count is 0 and decode returns before, so "
        "chosen is never empty there and the else branch is never taken",
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_210":
        "equivalent: strict=True only guards lengths equal by construction (rows holds "
        "the columns of the used replies, chosen one reply per used worker)",
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
    # reports
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_31": _REPORTS_SHORTER_SUM,
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_32": _REPORTS_SHORTER_SUM,
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_44":
        "killed since by test_a_reply_within_its_count_bound_is_settled_without_the_scale",
    "fl_gradcode.flower.reports.x_check_reply_sizes__mutmut_58":
        "equivalent: |num_examples| only decides the scale bound when it exceeds the scale, "
        "and then that bound is max(|num_examples|, 1) times SIZE_RTOL, the first test's, "
        "which has just failed; without it the bound is smaller and fails too (a NaN count "
        "fails every comparison either way)",
    "fl_gradcode.flower.reports.x_agree_sizes__mutmut_7":
        "equivalent: zip reads strict by truth value, so strict=None is strict=False",
    "fl_gradcode.flower.x___getattr____mutmut_1":
        "killed in effect, not by mutmut's verdict: with 'name in _LAZY' every lookup of a "
        "name the package lacks (pytest asks for __wrapped__) raises KeyError, so pytest "
        "cannot collect the tests (exit code 2, which mutmut reports as 'interrupted'); "
        "checked by applying it alone",
    "fl_gradcode.flower.membership.x__short__mutmut_5":
        "killed since by test_a_malformed_identity_is_a_failure_with_its_own_short_reason_and_"
        "a_bad_range_named (a short rejection reason is kept uncut)",
    "fl_gradcode.flower.options.xǁOptionsǁfrom_keywords__mutmut_108":
        "equivalent: _code_options never reads its s argument (s_max and m are the "
        "keywords it merges)",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_19":
        "equivalent: for a code object exact=True puts grouped-rs (it builds for every s < n) "
        "before the smaller-s candidates, the only ones that read the options",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_53":
        "equivalent: crc builds for every s < n (checked for n <= 40; its only refusals are "
        "bad options and s outside 0..n-1, which code_for_cohort caps), so a crc spec never "
        "reaches the fallback whose exactness the name decides",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_61":
        "equivalent: with tried_spec falsy the spec is tried again with the same s, fails "
        "with the same ValueError and is skipped",
    "fl_gradcode.flower.membership.x_code_for_cohort__mutmut_70":
        "equivalent: with tried_spec=False the spec is tried again with the same s, fails "
        "with the same ValueError and is skipped",
    "fl_gradcode.flower.membership.xǁMembershipǁ_forget_departed__mutmut_18": _CLAIMS_ORDERED,
    "fl_gradcode.flower.membership.xǁMembershipǁnum_partitions__mutmut_9": _CLAIMS_ORDERED,
    "fl_gradcode.flower.membership.xǁMembershipǁverdicts__mutmut_18": _CLAIMS_ORDERED,
    "fl_gradcode.flower.membership.xǁMembershipǁadmit__mutmut_63":
        "equivalent: admit resets _failed_rounds only where it also sets accepted_ever, and "
        "_give_up returns before reading _failed_rounds once accepted_ever is set (nothing "
        "clears it), so the value written there is never read",
    "fl_gradcode.flower.membership.xǁMembershipǁ__init____mutmut_8":
        "killed since by test_an_empty_nonce_is_replaced_by_the_default_one",
    "fl_gradcode.flower.membership.xǁMembershipǁ_forget_departed__mutmut_8": _MEMBERSHIP_DEPART,
    "fl_gradcode.flower.membership.xǁMembershipǁ_forget_departed__mutmut_14": _MEMBERSHIP_DEPART,
    "fl_gradcode.flower.membership.xǁMembershipǁadmit__mutmut_38": _MEMBERSHIP_HINT,
    "fl_gradcode.flower.membership.xǁMembershipǁadmit__mutmut_44": _MEMBERSHIP_HINT,
    "fl_gradcode.flower.membership.xǁMembershipǁadmit__mutmut_61":
        "killed since by test_once_a_node_was_accepted_membership_never_ends_the_run",
    "fl_gradcode.flower.membership.xǁMembershipǁadmit__mutmut_68":
        "killed since by test_no_decodable_set_ends_the_run_naming_the_rounds_and_the_nodes",
    "fl_gradcode.flower.membership.xǁMembershipǁhandshake__mutmut_59": _MEMBERSHIP_MALFORMED,
    "fl_gradcode.flower.membership.xǁMembershipǁhandshake__mutmut_64": _MEMBERSHIP_MALFORMED,
    "fl_gradcode.flower.membership.xǁMembershipǁverdicts__mutmut_10":
        "killed since by test_the_earliest_claimant_keeps_a_partition_whatever_the_node_ids",
    "fl_gradcode.data.x__synthetic__mutmut_15": _LEARNING_SYNTHETIC,
    "fl_gradcode.data.x__synthetic__mutmut_58": _LEARNING_SYNTHETIC,
    "fl_gradcode.data.x__synthetic__mutmut_66": _LEARNING_SYNTHETIC,
    "fl_gradcode.data.x__synthetic__mutmut_42":
        "equivalent: numpy's Generator.normal defaults scale to 1.0, the value it names",
    "fl_gradcode.data.x__synthetic__mutmut_50":
        "equivalent: normal(1, size=10) and normal(u, 1, size=10) draw the same ten standard "
        "normals z (1 + z against u + z), so b moves by the same constant 1 - u in every class "
        "and argmax(x W + b) keeps every label; b is used nowhere else (checked: the FedProx "
        "reference test passes with it applied)",
    "fl_gradcode.data.x_partition_indices__mutmut_1": _LEARNING_K,
    "fl_gradcode.data.x_partition_indices__mutmut_6": _LEARNING_K,
    "fl_gradcode.data.x_partition_indices__mutmut_7": _LEARNING_K,
    "fl_gradcode.data.x_partition_indices__mutmut_10": _LEARNING_K,
    "fl_gradcode.data.x_partition_indices__mutmut_43":
        "equivalent: the parts are tuples of Python ints, which numpy 2 stores as int64 (its "
        "default integer on every platform); an empty part (float64) raises just after",
    "fl_gradcode.data.x_run_partitions__mutmut_12": _LEARNING_RUN_PARTITIONS,
    "fl_gradcode.data.x_run_partitions__mutmut_13": _LEARNING_RUN_PARTITIONS,
    "fl_gradcode.data.x_run_partitions__mutmut_31": _LEARNING_RUN_PARTITIONS,
    "fl_gradcode.learning.x_dp_sgd_steps__mutmut_3":
        "killed since by test_dp_sgd_steps_are_one_full_batch_step_or_the_loaders_batches_per_"
        "epoch",
    "fl_gradcode.learning.x_dp_sgd_update__mutmut_123":
        "equivalent: Opacus' DPOptimizer.zero_grad always sets grad_sample and summed_grad to "
        "None, and its add_noise assigns p.grad = summed_grad + noise for every parameter "
        "before the SGD step, so whether p.grad was zeroed or set to None is never read "
        "(Opacus 1.6)",
    "fl_gradcode.learning.x_dp_sgd_update__mutmut_13": _LEARNING_DP_INPUTS,
    "fl_gradcode.learning.x_dp_sgd_update__mutmut_18": _LEARNING_DP_INPUTS,
    "fl_gradcode.learning.x_dp_sgd_update__mutmut_90": _LEARNING_DP_INPUTS,
    "fl_gradcode.learning.x_dp_sgd_update__mutmut_58":
        "killed since by test_dp_gradient_update_passes_a_tiny_per_example_gradient_unscaled",
    "fl_gradcode.learning.x_make_model__mutmut_27":
        "killed since by test_dense_models_take_inputs_in_their_input_shape_or_flat",
    "fl_gradcode.learning.x_make_model__mutmut_52":
        "killed since by test_models_are_float64_from_the_start",
    "fl_gradcode.learning.x_partition_update__mutmut_59":
        "killed since by test_local_update_with_one_batch_per_epoch_is_full_batch_gradient_"
        "descent",
    "fl_gradcode.learning.xǁ_CNNǁ__init____mutmut_18":
        "killed since by test_cnn_is_conv_relu_pool_conv_relu_then_a_linear_head",
    "fl_gradcode.learning.xǁ_CNNǁ__init____mutmut_7":
        "killed since by test_cnn_is_conv_relu_pool_conv_relu_then_a_linear_head",
    "fl_gradcode.adaptive.choice.x__candidates__mutmut_35":
        "killed since by test_choose_s_refuses_exclusion_on_a_fixed_code_and_busy_until_"
        "with_pending",
    "fl_gradcode.adaptive.choice.x_choose_s__mutmut_26":
        "killed since by test_choose_s_refuses_exclusion_on_a_fixed_code_and_busy_until_"
        "with_pending",
    "fl_gradcode.adaptive.choice.x__slow_clients__mutmut_5":
        "killed since by test_a_client_slower_than_the_factor_is_excluded_when_that_is_"
        "faster",
    "fl_gradcode.adaptive.choice.x_choose_s__mutmut_75":
        "killed since by test_a_client_slower_than_the_factor_is_excluded_when_that_is_"
        "faster",
    "fl_gradcode.adaptive.choice.x_choose_s__mutmut_80":
        "killed since by test_a_client_slower_than_the_factor_is_excluded_when_that_is_"
        "faster",
    "fl_gradcode.adaptive.choice.x_choose_s__mutmut_201":
        "killed since by test_an_approximate_choice_only_as_fast_as_the_exact_one_is_not_"
        "taken",
    "fl_gradcode.adaptive.choice.x_expected_round_time__mutmut_12":
        "killed since by test_before_data_the_round_time_is_drawn_per_unit_from_the_"
        "prior_with_the_given_rng",
    "fl_gradcode.adaptive.estimator.xǁLatencyEstimatorǁsample__mutmut_19":
        "killed since by test_before_data_the_round_time_is_drawn_per_unit_from_the_"
        "prior_with_the_given_rng",
    "fl_gradcode.adaptive.estimator.xǁLatencyEstimatorǁsample__mutmut_23":
        "killed since by test_before_data_the_round_time_is_drawn_per_unit_from_the_"
        "prior_with_the_given_rng",
    "fl_gradcode.adaptive.estimator.xǁLatencyEstimatorǁobserve_pending__mutmut_12":
        "killed since by test_a_pending_reply_is_censored_at_its_compute_time_after_the_"
        "busy_wait",
    "fl_gradcode.adaptive.fitting.x_estimate_beta__mutmut_54":
        "killed since by test_the_load_exponent_is_clipped_to_one_when_time_grows_faster_"
        "than_the_load",
    "fl_gradcode.adaptive.rules.xǁDecodeRuleǁtimes__mutmut_104":
        "killed since by test_a_multi_group_rule_with_large_thresholds_takes_each_groups_"
        "order_statistic",
    "fl_gradcode.adaptive.rules.xǁDecodeRuleǁtimes__mutmut_87":
        "killed since by test_a_multi_group_rule_with_large_thresholds_takes_each_groups_"
        "order_statistic",
    "fl_gradcode.adaptive.survival.x_fit_gpd__mutmut_16":
        "killed since by test_five_events_are_enough_for_a_gpd_tail_and_fewer_give_the_"
        "exponential_one",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁ__init____mutmut_45":
        "killed since by test_a_curve_without_events_puts_all_mass_beyond_the_largest_"
        "censoring_time",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁlog_tables__mutmut_109":
        "killed since by test_the_survival_table_beyond_the_last_event_is_the_gpd_tail",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁlog_tables__mutmut_13":
        "not killed on the fixed log_tables (survived the re-run after the kernel-length fix): "
        "without the upper clip, events beyond the table land past its end and reach the last "
        "cells only through the kernel; test_events_outside_the_table_grid_land_in_its_edge_"
        "cells killed it on the old slicing only; a test of the last cells' mass is not written",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁlog_tables__mutmut_30":
        "not reviewed (time): survived the re-run after the log_tables fix; weights=jumps "
        "should be observable with censored or weighted events",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁsample__mutmut_23":
        "not reviewed (time): survived the re-run after the log_tables fix",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁlog_tables__mutmut_21":
        "killed since by test_an_event_at_the_start_of_the_grid_centres_the_kernel_on_"
        "the_first_cell",
    "fl_gradcode.adaptive.survival.xǁSurvivalǁsample__mutmut_20":
        "killed since by test_sampling_between_the_last_two_events_returns_the_last_event",
    "fl_gradcode.adaptive.estimator.xǁCohortViewǁsample_remaining__mutmut_8": _VIEW_LOAD_DTYPE,
    "fl_gradcode.adaptive.fitting.x_estimate_beta__mutmut_34": _BETA_CENTRING,
    "fl_gradcode.adaptive.rules.xǁDecodeRuleǁtimes__mutmut_29": _PARTITION_AXIS,
    "fl_gradcode.adaptive.survival.xǁSurvivalǁ__init____mutmut_30": _KM_FACTOR_IN_0_1,
    "fl_gradcode.adaptive.survival.xǁSurvivalǁ__init____mutmut_31": _KM_FACTOR_IN_0_1,
    "fl_gradcode.adaptive.survival.xǁSurvivalǁ__init____mutmut_36": _KM_FACTOR_IN_0_1,
    "fl_gradcode.adaptive.fitting.x_slowness_map__mutmut_121": _SLOWNESS_EDGE,
    "fl_gradcode.flower.latency_book.x_read_latency_state__mutmut_10":
        "equivalent: codec names are case-blind ('UTF-8' and 'utf-8' are the same codec)",
    "fl_gradcode.flower.policy.xǁFixedCodePolicyǁobserve__mutmut_16":
        "equivalent: the estimator's update reads elapsed as np.asarray(v, float64): None -> nan",
    **{_COMPAT + m: _COMPAT_ZIP for m in (
        "x__same__mutmut_14", "x__same__mutmut_36", "x__same__mutmut_49", "x__same__mutmut_50",
        "x__same__mutmut_57", "x_check_averaging__mutmut_60", "x_check_averaging__mutmut_111")},
    _COMPAT + "x_check_averaging__mutmut_54": _ASTYPE_NONE,
    _COMPAT + "x_check_caller__mutmut_2": _COMPAT_FRAMES,
    _COMPAT + "xǁReplyFingerprintsǁ__init____mutmut_2": _COMPAT_SEEN,
    _COMPAT + "x_check_averaging__mutmut_79": (
        "killed since by test_averaging_check_leaves_state_the_inner_strategy_changes_in_place_"
        "untouched and test_inner_state_changed_in_place_sees_only_the_real_rounds"),
    "fl_gradcode.flower.deadline.xǁDeadlineFedAvgǁstart__mutmut_29":
        "equivalent: _evaluating is only read as `if not self._evaluating` (aggregate_train), "
        "where None and False are the same",
    # mod
    "fl_gradcode.flower.encoding.x_accumulate_delta__mutmut_7":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension "
        "(new.reshape(-2) == new.reshape(-1), numpy 2.4)",
    "fl_gradcode.flower.encoding.x_accumulate_delta__mutmut_10":
        "equivalent: numpy's reshape takes any negative size as the one unknown dimension "
        "(old.reshape(-2) == old.reshape(-1), numpy 2.4)",
    **{"fl_gradcode.flower.encoding.x_coded_update__mutmut_" + m:
       "equivalent: strict only guards lengths already equal: coded_update raises ValueError "
       "first when len(weights) != len(models), and news has one entry per model"
       for m in ("57", "60")},
    "fl_gradcode.flower.mod.x__coded_reply__mutmut_208":
        "equivalent: coded_update then returns float64 and train_reply's npy_array casts it "
        "to the same wire dtype (astype, same_kind): one rounding of the same float64 sum, "
        "the same bits as coded_update's copyto (only a full-size float64 copy more)",
    "fl_gradcode.flower.mod.x__run_partition__mutmut_61":
        "equivalent: a second pass runs only if torch was absent before the call and imported "
        "during it; that pass sets torch, so it always ends in the break (no third pass)",
    "fl_gradcode.flower.mod.x__coded_reply__mutmut_74":
        "equivalent: strict only guards lengths equal by then: the instruction comes from "
        "parse_instruction, which refuses partition-ids and coefficients of different lengths "
        "(dataclasses.replace changes only the nonce)",
    "fl_gradcode.flower.mod.x__claim_round__mutmut_11":
        "equivalent: the result only decides whether a failed computation releases its claim; "
        "an unguarded node (no keys, no dp-state-file) never claimed, so release discards an "
        "absent in-memory pair and has no file to touch (differs only if the same node_id's "
        "keys appear and vanish between calls of one process, via FL_GRADCODE_DP_KEY_FILE)",
    # codes
    "fl_gradcode.codes.cyclic_solver.x_cyclic_decoding_vector__mutmut_107":
        "equivalent: solve_triangular only tests check_finite for truth (_asarray_validated: "
        "asarray_chkfinite if check_finite else asarray), and None is falsy like False",
    **{"fl_gradcode.codes.cyclic_solver.xǁCyclicLeastSquaresǁ__init____mutmut_" + m:
       "equivalent: LAPACK band storage puts A(i, j) in row kl+ku+i-j whatever LDAB is (the "
       "wrappers take ldab = ab.shape[0]); dgbtrf/dgbtrs need LDAB >= 2kl+ku+1 and never touch "
       "the rows past it, so spare zero rows at the bottom change nothing" for m in ("62", "63")},
    "fl_gradcode.codes.base.xǁGradientCodeǁ__init____mutmut_59":
        "equivalent: np.full with dtype=None takes the fill value's dtype, and -1 is an int64 "
        "(block indices are assigned into it and block_of returns int(...) either way)",
    "fl_gradcode.codes.comm_efficient.xǁCommunicationEfficientCodeǁcondition_number__mutmut_14":
        "equivalent: float() parses 'inf' case-blind, float('INF') == float('inf')",
    "fl_gradcode.codes.cyclic_solver.xǁCyclicLeastSquaresǁsolve_once__mutmut_9":
        "equivalent on every input the codes pass: check_finite=True only adds an "
        "asarray_chkfinite pass that raises on NaN/Inf; R comes from the QR of a finite matrix "
        "and the right-hand sides from weights check_weights keeps finite and their residuals",
    **{"fl_gradcode.codes.nested.x_reflected_misses__mutmut_" + m:
       "equivalent: no (p, x) is ever hit twice, so counts is 0/1 with += or = and max <= 1 "
       "or <= 2 both hold: the offsets all share one parity, so x = m-1+d-p are distinct with "
       "one parity per row; reflecting x<0 to -1-x or x>=m to 2m-1-x flips the parity (a clash "
       "with an unreflected x needs d1+d2 odd), and a low/high clash needs d2-d1 = 2m > 2k"
       for m in ("87", "99")},
    "fl_gradcode.codes.nested.xǁNestedPlacementǁ__init____mutmut_62":
        "equivalent: starts = [0] + cumsum(sizes)[:-1] has len(sizes) entries by construction, "
        "so zip's strict check can never fire",
    "fl_gradcode.codes.repetition.xǁFractionalRepetitionCodeǁis_decodable__mutmut_8":
        "equivalent: frc_matrix refuses n % (s+1) != 0, so n / (s+1) is an integral float "
        "equal to n // (s+1) and the int == float comparison is the same",
    # grid
    "fl_gradcode.flower.grid.xǁEarlyReturnGridǁexpire__mutmut_15":
        "equivalent: expire only gives up ids whose _expires entry exists (get(mid, now + 1.0) "
        "<= now), so pop(mid) never meets a missing key and its default is never used",
    "fl_gradcode.flower.grid.xǁEarlyReturnGridǁexpire__mutmut_13":
        "killed since by test_a_given_up_message_leaves_no_reference_to_its_id",
    # decoder
    "fl_gradcode.flower.decoder.xǁDecoderǁdecode__mutmut_102":
        "equivalent: np.dtype(None) is float64 (numpy's default dtype), the dtype it names; "
        "kinds is empty only for an array of no values, whose result is empty either way",
    # integrity
    "fl_gradcode.flower.integrity.x__candidates__mutmut_94":
        "killed since by test_a_large_block_confirms_only_its_candidates_whatever_its_size",
    "fl_gradcode.flower.integrity.xǁProbeǁ_sampled__mutmut_8":
        "killed since by test_the_sampled_probe_reads_a_long_double_reply_as_its_float64_rounding",
    "fl_gradcode.flower.integrity.x__ratio__mutmut_18": _INF_CASE,
    "fl_gradcode.flower.integrity.x_verify_refusal__mutmut_19":
        "equivalent: the default is read only when options has no 'm', and then 2 != 1 and "
        "None != 1 are both True (a comm-efficient code without m is chunked either way)",
    "fl_gradcode.flower.integrity.xǁProbeǁ__init____mutmut_7":
        "not killed: the words only seed numpy's SeedSequence and BLAKE2b, which take any "
        "non-negative int; 33-bit words make a 264- instead of a 256-bit secret key, and every "
        "documented property (fresh OS randomness, never the run seed, never sent) holds for "
        "either, so only a test pinning secrets.randbits' argument could tell them apart",
    "fl_gradcode.flower.integrity.x__candidates__mutmut_128":
        "not killed, unreachable in float64: diff is empty only if every other row whose "
        "null-space part survives c's removal (rest_weight > 1e-12) has rest_a exactly 0.0; "
        "those rest_weights sum to dim N - 1 (dim N = 1 is taken by the direction test first), "
        "so one is >= 1/|F|, and its rest_a, its weight in the min-norm decoding without c, "
        "comes from an SVD: a GradientCode block has no zero rows (they are blockless) and "
        "weights zero in exact arithmetic come out 1e-17..3e-16, not 0.0 (rows (1,1) x2 and "
        "(1,-1) x15..19, checked); only then would np.max without initial raise",
    # pipeline
    "fl_gradcode.flower.collector.xǁReplyCollectorǁ__init____mutmut_7":
        "equivalent: warned_unverifiable is read only as `not self.warned_unverifiable` in "
        "probe_for (nowhere else in the package or tests), and None is falsy like False",
    "fl_gradcode.flower.collector.xǁReplyCollectorǁprioritize__mutmut_18":
        "equivalent: the sentinel only has to miss `pending`; pending_blocks is a subset of "
        "range(len(code.blocks)) (DecodabilityTracker._pending starts as that set and only loses "
        "members), so -1 and -2 are both never in it",
}
