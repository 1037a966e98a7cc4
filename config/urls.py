from django.urls import include, path

# No django.contrib.admin: every admin change must go through a service that writes the
# audit log in the same transaction; the admin pages are built on those services.
urlpatterns = [
    path("", include("billing.urls")),
]

# Says whom a page is for in the reader's language (404 and 500: Django's, with our templates).
handler403 = "billing.web.error_pages.permission_denied"
