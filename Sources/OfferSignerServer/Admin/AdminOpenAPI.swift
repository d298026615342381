/// The dashboard's routes in the OpenAPI document (``OpenAPIDocument``): `text/html` pages and
/// redirects, each answering 404 `not_found` unless `serve --admin-token-file` is given.
enum AdminOpenAPI {
    private static func page(_ path: String, _ operationID: String, _ summary: String, query: String? = nil) -> String {
        var lines = [
            "  \(path):", "    get:", "      operationId: \(operationID)", "      summary: '\(summary) (admin token; 404 unless --admin-token-file)'",
            "      security: [{admin: []}]",
        ]
        if let query { lines.append("      parameters: [\(query)]") }
        lines += ["      responses:", "        '200': {$ref: '#/components/responses/AdminPage'}"]
        if query != nil { lines.append("        '400': {$ref: '#/components/responses/Problem'}") }
        lines += [
            "        '401': {$ref: '#/components/responses/Problem'}", "        '404': {$ref: '#/components/responses/Problem'}",
            "        '429': {$ref: '#/components/responses/RateLimited'}",
        ]
        return lines.joined(separator: "\n") + "\n"
    }

    static let paths: String =
        "\n"
        + """
          /admin:
            get:
              operationId: adminHome
              summary: The dashboard; redirects to /admin/offers (admin token; 404 unless --admin-token-file)
              security: [{admin: []}]
              responses:
                '303': {$ref: '#/components/responses/AdminRedirect'}
                '401': {$ref: '#/components/responses/Problem'}
                '404': {$ref: '#/components/responses/Problem'}
                '429': {$ref: '#/components/responses/RateLimited'}
          /admin/login:
            get:
              operationId: adminLoginForm
              summary: The dashboard's sign-in form (404 unless --admin-token-file)
              security: []
              responses:
                '200': {$ref: '#/components/responses/AdminPage'}
                '404': {$ref: '#/components/responses/Problem'}
            post:
              operationId: adminLogin
              summary: Signs in with the admin token (form field `token`); sets the session cookie, redirects to /admin/offers
              security: []
              requestBody:
                content:
                  application/x-www-form-urlencoded:
                    schema: {type: object, properties: {token: {type: string}}}
              responses:
                '303': {$ref: '#/components/responses/AdminRedirect'}
                '401': {$ref: '#/components/responses/AdminPage'}
                '403': {$ref: '#/components/responses/Problem'}
                '404': {$ref: '#/components/responses/Problem'}
                '413': {$ref: '#/components/responses/Problem'}
                '429': {$ref: '#/components/responses/RateLimited'}
          /admin/logout:
            post:
              operationId: adminLogout
              summary: Clears the dashboard's session cookie; redirects to /admin/login (404 unless --admin-token-file)
              security: []
              responses:
                '303': {$ref: '#/components/responses/AdminRedirect'}
                '403': {$ref: '#/components/responses/Problem'}
                '404': {$ref: '#/components/responses/Problem'}

        """
        + page("/admin/offers", "adminOffers", "Dashboard: offers, per day over 30 or 90 days", query: "{name: days, in: query, required: false, schema: {type: integer, enum: [30, 90]}}")
        + page("/admin/retention", "adminRetention", "Dashboard: Retention Messaging answers and latency")
        + page("/admin/apple", "adminApple", "Dashboard: notifications and the App Store Server API")
        + page("/admin/keys", "adminKeys", "Dashboard: keys and the audit log")
        + page("/admin/clients", "adminClients", "Dashboard: API clients")
}
