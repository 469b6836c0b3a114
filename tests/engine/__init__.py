"""The engine's parts: the Lua scripts, identities, the ledger and its holds, the lease, the fetch phases,
pipelines, the key prefix, keys and ACLs, and the architecture."""
