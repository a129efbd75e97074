"""HTTP on the main port (aiohttp on the node's event loop): health, metrics, Open API."""
