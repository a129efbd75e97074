"""The web console's static files (``static/``), served at ``/nacos/`` by
:mod:`shoal.transport.http.console_api`. No build step: plain HTML, CSS and one JS module."""
