import Foundation
import OfferSignerPostgres
import Testing

/// Parsing of the PostgreSQL store URL: every part, every password source, and errors and
/// descriptions that never contain the password.
@Suite("PostgreSQL store URL")
struct PostgresStoreConfigurationTests {
    @Test("Every part of a full URL, percent-decoded; postgresql:// too; defaults for port and sslmode")
    func parts() throws {
        let full = try PostgresStoreConfiguration(url: "postgres://offer%40signer:p%3Ass%40w0rd@db.example.com:6543/offers_prod?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem")
        #expect(full.username == "offer@signer")
        #expect(full.password == "p:ss@w0rd")
        #expect(full.host == "db.example.com" && full.port == 6543 && full.database == "offers_prod")
        #expect(full.tlsMode == .verifyFull && full.rootCertificatePath == "/etc/ssl/ca.pem")
        #expect(full.poolSize == PostgresStoreConfiguration.defaultPoolSize)

        let short = try PostgresStoreConfiguration(url: "postgresql://offer@localhost/offers")
        #expect(short.port == 5432 && short.tlsMode == .prefer && short.password == nil)
        let ipv6 = try PostgresStoreConfiguration(url: "postgres://offer@[::1]:5433/offers?sslmode=disable")
        #expect(ipv6.host == "::1" && ipv6.port == 5433 && ipv6.tlsMode == .disable)
        #expect(try PostgresStoreConfiguration(url: "POSTGRES://u@h/d?sslmode=require").tlsMode == .require)
    }

    @Test("Attack: a network attacker downgrades the connection. Without sslmode, a remote host gets verify-full; loopback and sockets keep prefer; require and weaker are warned about")
    func defaultTLSModeIsVerifyFull() throws {
        for remote in ["db.example.com", "10.0.0.5", "[2001:db8::1]", "localhost.example.com"] {
            let configuration = try PostgresStoreConfiguration(url: "postgres://offer@\(remote)/offers")
            #expect(configuration.tlsMode == .verifyFull, "\(remote)")
            #expect(configuration.weakTLSWarning == nil)
        }
        for local in ["localhost", "127.0.0.1", "127.0.1.1", "[::1]"] {
            let configuration = try PostgresStoreConfiguration(url: "postgres://offer@\(local)/offers")
            #expect(configuration.tlsMode == .prefer, "\(local)")
            #expect(configuration.weakTLSWarning == nil)
        }
        #expect(PostgresStoreConfiguration.isLocal(host: "/var/run/postgresql"))
        // A DNS name that merely starts like a loopback address crosses the network: verify-full.
        for name in ["127.db.example.net", "127.0.0.1.example.net", "127.0.0.256"] {
            let configuration = try PostgresStoreConfiguration(url: "postgres://offer@\(name)/offers")
            #expect(configuration.tlsMode == .verifyFull, "\(name)")
        }
        let required = try PostgresStoreConfiguration(url: "postgres://offer:pw@db.example.com/offers?sslmode=require")
        #expect(required.tlsMode == .require)
        #expect(required.weakTLSWarning?.contains("does not verify") == true && required.weakTLSWarning?.contains("pw") == false)
        #expect(try PostgresStoreConfiguration(url: "postgres://offer@db.example.com/offers?sslmode=disable").weakTLSWarning != nil)
        #expect(PostgresStoreConfiguration.isPostgresURL("postgresql://x") && !PostgresStoreConfiguration.isPostgresURL("/var/lib/offer-signer/store.sqlite"))
    }

    @Test("The password: from the URL, else PGPASSWORD, else the password file (one trailing newline dropped)")
    func passwordSources() throws {
        let environment = ["PGPASSWORD": "from-environment"]
        #expect(try PostgresStoreConfiguration(url: "postgres://u:from-url@h/d", environment: environment, passwordFileContents: "from-file").password == "from-url")
        #expect(try PostgresStoreConfiguration(url: "postgres://u@h/d", environment: environment, passwordFileContents: "from-file").password == "from-environment")
        #expect(try PostgresStoreConfiguration(url: "postgres://u@h/d", environment: [:], passwordFileContents: "from-file\n").password == "from-file")
        #expect(try PostgresStoreConfiguration(url: "postgres://u@h/d", environment: ["PGPASSWORD": ""], passwordFileContents: nil).password == nil)
        #expect(throws: PostgresStoreConfiguration.InvalidConfiguration.self) {
            try PostgresStoreConfiguration(url: "postgres://u@h/d", passwordFileContents: "\n")
        }
    }

    @Test("Mistakes are named; no message or description ever holds the password")
    func mistakesAndRedaction() throws {
        let secret = "s3cr3t-\(UUID().uuidString)"
        let bad: [(String, String)] = [
            ("mysql://u:\(secret)@h/d", "postgres://"),
            ("postgres://u:\(secret)@h/d?sslmode=allow", "sslmode"),
            ("postgres://u:\(secret)@h/d?sslmode=verify-ca", "sslmode"),
            ("postgres://u:\(secret)@h:0/d", "port"),
            ("postgres://u:\(secret)@h:http/d", "port"),
            ("postgres://u:\(secret)@h", "database"),
            ("postgres://u:\(secret)@h/", "database"),
            ("postgres://u:\(secret)@/d", "host"),
            ("postgres://h/d", "user"),
            ("postgres://u:\(secret)@[::1/d", "IPv6"),
            ("postgres://u:\(secret)%zz@h/d", "percent-encoded"),
            ("postgres://u:\(secret)@h/d?timeout=3", "timeout"),
            ("postgres://u:\(secret)@h/d?sslmode=require&sslrootcert=/ca.pem", "sslrootcert"),
        ]
        for (url, mention) in bad {
            #expect {
                try PostgresStoreConfiguration(url: url)
            } throws: { error in
                let message = "\(error)"
                return message.contains(mention) && !message.contains(secret) && !message.contains(url)
            }
        }
        #expect(throws: PostgresStoreConfiguration.InvalidConfiguration.self) { try PostgresStoreConfiguration(url: "postgres://u@h/d", poolSize: 0) }
        // Two connections cannot serve a request that holds its customer lock on one and reads on another.
        #expect(throws: PostgresStoreConfiguration.InvalidConfiguration.self) { try PostgresStoreConfiguration(url: "postgres://u@h/d", poolSize: 2) }

        let configuration = try PostgresStoreConfiguration(url: "postgres://offer:\(secret)@db:5432/offers?sslmode=require")
        #expect(configuration.redactedDescription == "postgres://offer:***@db:5432/offers?sslmode=require")
        #expect("\(configuration)" == configuration.redactedDescription)
        #expect(!String(reflecting: configuration).contains(secret))
        var dumped = ""
        dump(configuration, to: &dumped)
        #expect(!dumped.contains(secret) && dumped.contains("redacted"), "\(dumped)")
        let fromEnvironment = try PostgresStoreConfiguration(url: "postgres://offer@db/offers", environment: ["PGPASSWORD": secret])
        #expect(!fromEnvironment.redactedDescription.contains(secret) && fromEnvironment.redactedDescription.contains(":***@"))
    }
}
