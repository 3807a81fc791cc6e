// Small behaviours shared by every console page.
document.addEventListener("DOMContentLoaded", () => {
  const toggle = document.querySelector("[data-nav-toggle]");
  if (toggle) {
    toggle.addEventListener("click", () => document.querySelector(".sidebar").classList.toggle("open"));
  }
  // A select that submits its form when changed (no inline handlers: the CSP forbids them).
  document.querySelectorAll("select[data-autosubmit]").forEach((select) => {
    select.addEventListener("change", () => select.form.submit());
  });
  document.querySelectorAll("[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
  document.querySelectorAll("[data-copy]").forEach((button) => {
    button.addEventListener("click", async () => {
      await navigator.clipboard.writeText(document.querySelector(button.dataset.copy).textContent.trim());
      button.textContent = "Copied";
    });
  });
});
