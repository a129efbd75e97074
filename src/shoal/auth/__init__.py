"""Auth of the Nacos default plugin: users (bcrypt), roles, permissions, HS256 tokens."""
