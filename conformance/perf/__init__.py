"""Performance: one timing method (:mod:`.timing`: CUDA events, L2 flush, warm-up by time) and the
roofline models that turn a time into a share of the hardware's peak (:mod:`.roofline`)."""
