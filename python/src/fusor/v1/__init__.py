"""fusor's wire contract (proto/fusor/v1), generated when the package is built."""
