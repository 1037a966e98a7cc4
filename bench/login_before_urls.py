"""bench/login.py's "before" URLs: the product's, with Django's own LoginView in front (it answers
LOGIN_REDIRECT_URL, "/", which redirects to the role's page)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from billing.urls import urlpatterns as product

urlpatterns = [path("accounts/login/", auth_views.LoginView.as_view(), name="login"), *product]
