"""One module per executable statement (see verification.core.registry for the module contract)."""
