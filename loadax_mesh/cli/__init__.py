"""`loadax-mesh`: the parser, one module per command family."""
