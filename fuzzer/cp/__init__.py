"""Context parallelism (CP): sharding a case over ``cp_size`` ranks, the multi-process executor, CP judging and the CP campaign."""
