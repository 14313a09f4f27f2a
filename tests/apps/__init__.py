"""Small WSGI apps that the integration tests run under real servers."""
