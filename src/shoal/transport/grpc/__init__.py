"""Nacos gRPC SDK protocol (main port + 1000): unary Request/request, BiRequestStream."""
