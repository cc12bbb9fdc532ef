"""The parts of :func:`~fl_gradcode.flower.mod.gradient_coding_mod`, in the order a coded
``train`` message meets them:

* :mod:`.instruction`: the instruction check (the node's policy, partition keys, replays);
* :mod:`.partitions`: the per-partition runs of the wrapped app (seeded by :mod:`.seeding`,
  shared between replicas by an in-process cache);
* :mod:`.release`: the DP release of each partition's delta;
* :mod:`.accumulate`: the coded accumulation ``sum_j B[i,j] n_j (theta_j - theta)``;
* :mod:`.deadline`: where work stops at its round's deadline, and wallclock timing's latency;
* :mod:`.wire`: the reply's wire encoding (wire dtype, communication-efficient chunks);
* :mod:`.notices`: the warnings a mod instance gives once.

Nothing is imported here: a ClientApp process imports only the parts the mod uses.
"""
