"""TPU: ahead-of-time compilation for TPU topologies from any host, and the HLO report."""
