"""Server push of service changes to subscribers (Nacos push/v2)."""
