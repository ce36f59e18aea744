"""Model backends. Each implements the contract in :mod:`retool.types`."""
