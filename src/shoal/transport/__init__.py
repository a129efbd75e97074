"""Wire edges: the only place where exceptions become wire responses."""
