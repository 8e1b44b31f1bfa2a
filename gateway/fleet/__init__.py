"""Fleet: the contract between the control plane and media workers (models, links, internal API)."""
