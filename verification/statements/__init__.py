"""One module per executable statement (see verification.registry for the module contract)."""
