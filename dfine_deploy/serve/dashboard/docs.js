// The API page (/docs): Swagger UI from the fastapi-offline package, served by this server, so the page
// works without a network and under the server's Content-Security-Policy (no inline script).
"use strict";

window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    validatorUrl: null, // the default sends the schema to an outside validator
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
