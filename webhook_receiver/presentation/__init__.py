"""What people read: values put in words (durations, moments, JSON, answers, URLs with
their credentials masked), the SVG charts, and links into the admin."""
