"""Projections: the paper's tables and the roofline that projects Table 2 onto hardware."""
